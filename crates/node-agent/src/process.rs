//! Starting a container process inside its pod's sandbox.
//!
//! A container is a plain process on this machine, placed in:
//! - the pod's network namespace (so it listens on the pod IP and standard ports),
//! - its own mount namespace with a root file system of its own: this machine's root as the
//!   read-only lower layer of an overlay, with a writable upper layer per container (kept in
//!   the pod's folder across restarts of the container, removed with the pod). Fresh `/proc`,
//!   `/sys` and `/dev/shm`; this machine's `/dev`; other file systems of this machine appear
//!   read-only. The pod's volumes, `/etc/hosts` and `/etc/resolv.conf` are bind-mounted at the
//!   paths the pod spec names, then the process pivots into that root. So nothing it writes
//!   outside its volumes reaches this machine's files.
//! - its own UTS namespace with the pod's hostname,
//! - its own session, so that the whole process group can be signalled.
//!
//! Everything the child does between fork and exec is plain system calls on data prepared
//! beforehand, because only async-signal-safe work is allowed there.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

/// A bind mount into the container's view of the file system.
#[derive(Debug, Clone, PartialEq)]
pub struct BindMount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// Everything needed to start one container process.
#[derive(Debug, Clone, Default)]
pub struct ProcessSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<PathBuf>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub supplementary_groups: Vec<u32>,
    /// The pod's network namespace; `None` runs in the host network (hostNetwork pods).
    pub netns: Option<PathBuf>,
    pub hostname: Option<String>,
    pub mounts: Vec<BindMount>,
    /// The container's own folder: its writable layer (`upper`, `work`) and the mount point of
    /// its root (`root`).
    pub layer_dir: PathBuf,
    /// stdout and stderr are appended here.
    pub log_file: PathBuf,
}

/// Creates what a mount needs outside the container: a missing source (a `subPath` not created
/// yet) becomes an empty folder, as the kubelet does. Mount points are made inside the
/// container's own root, never on this machine.
pub fn prepare_mount_sources(mounts: &[BindMount]) -> io::Result<()> {
    for m in mounts {
        if !m.source.exists() {
            std::fs::create_dir_all(&m.source)?;
        }
    }
    Ok(())
}

/// File systems that stay as they are (fresh ones are mounted, or they are kernel interfaces).
const PSEUDO_ROOTS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// The mount points of this machine, other than `/`, that a container should see (read-only):
/// the overlay shows only the root file system, so without them the folders would be empty.
/// Kernel interfaces and network namespace handles are left out, and so is a mount inside
/// another one listed (the recursive bind brings it along). `mountinfo` is
/// `/proc/self/mountinfo`.
pub fn host_mounts(mountinfo: &str) -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = fields.get(4)?;
            let fstype = fields.iter().skip_while(|f| **f != "-").nth(1)?;
            Some((unescape_mount_path(point), *fstype))
        })
        .filter(|(point, fstype)| {
            point != Path::new("/")
                && *fstype != "nsfs"
                && !point.starts_with("/run/netns")
                && !PSEUDO_ROOTS.iter().any(|p| point.starts_with(p))
        })
        .map(|(point, _)| point)
        .collect();
    points.sort();
    points.dedup();
    let all = points.clone();
    points.retain(|p| !all.iter().any(|other| other != p && p.starts_with(other)));
    points
}

/// Mount paths in mountinfo escape space, tab, newline and backslash as octal.
fn unescape_mount_path(escaped: &str) -> PathBuf {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&escaped[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// `path` inside the container's root `root` (`path` is absolute in the container's view).
fn inside(root: &Path, path: &Path) -> PathBuf {
    let mut out = root.to_path_buf();
    for c in path.components() {
        if let Component::Normal(part) = c {
            out.push(part);
        }
    }
    out
}

/// Every prefix of `path` below `root`, shortest first: what `mkdir -p` creates.
fn prefixes_below(root: &Path, path: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut current = root.to_path_buf();
    for c in path.strip_prefix(root).unwrap_or(path).components() {
        if let Component::Normal(part) = c {
            current.push(part);
            out.push(current.clone());
        }
    }
    out
}

/// Where this machine's root stays, inside the container's new root, while volumes are mounted.
const OLD_ROOT: &str = ".noops-old-root";

/// Descriptors from here up hold mount sources in the child between fork and exec.
const PARKED_FD_BASE: i32 = 900;

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `mkdir` that does not mind an existing entry.
fn mkdir_if_missing(path: &CString) -> io::Result<()> {
    // SAFETY: a system call on a NUL-terminated path prepared before the fork.
    let rc = unsafe { libc::mkdir(path.as_ptr(), 0o755) };
    if rc == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// One bind mount as the child performs it, inside the new root: create the mount point, then
/// bind the parked source onto it.
struct PreparedMount {
    /// Folders to create (`mkdir -p`), shortest first.
    dirs: Vec<CString>,
    /// A file to create as the mount point (when the source is a file).
    file: Option<CString>,
    parked: CString,
    target: CString,
    read_only: bool,
}

/// Starts the process described by `spec`.
pub fn spawn(spec: &ProcessSpec) -> io::Result<Child> {
    prepare_mount_sources(&spec.mounts)?;
    if let Some(parent) = spec.log_file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let log = OpenOptions::new().create(true).append(true).open(&spec.log_file)?;
    let log_err = log.try_clone()?;

    // The container's layer: upper and work folders on this machine's disk, and the mount
    // point of its root.
    let root = spec.layer_dir.join("root");
    for dir in ["upper", "work", "root"] {
        std::fs::create_dir_all(spec.layer_dir.join(dir))?;
    }
    let overlay_options = cstr(&format!(
        "lowerdir=/,upperdir={},workdir={}",
        spec.layer_dir.join("upper").display(),
        spec.layer_dir.join("work").display()
    ))?;
    let root_c = cstring(&root)?;
    let proc_c = cstring(&root.join("proc"))?;
    let sys_c = cstring(&root.join("sys"))?;
    let dev_c = cstring(&root.join("dev"))?;
    let shm_c = cstring(&root.join("dev/shm"))?;
    let host_dev = cstr("/dev")?;
    let (overlay, proc_fs, sysfs, tmpfs) = (cstr("overlay")?, cstr("proc")?, cstr("sysfs")?, cstr("tmpfs")?);
    let shm_options = cstr("mode=1777,size=65536k")?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut host_binds: Vec<(CString, CString)> = vec![];
    for point in host_mounts(&mountinfo) {
        host_binds.push((cstring(&point)?, cstring(&inside(&root, &point))?));
    }

    // Everything the child needs, prepared before fork.
    let netns: Option<OwnedFd> = match &spec.netns {
        Some(path) => Some(File::open(path)?.into()),
        None => None,
    };
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());
    // Volumes are mounted in two steps inside the child: first every source is opened (O_PATH)
    // and parked on a fixed descriptor, while this machine's files are still in view; then,
    // once in the new root, each is bind-mounted from /proc/self/fd onto its target. Targets
    // are resolved inside the new root (a symlink such as /var/run -> /run leads to the
    // container's /run, not this machine's), and mounted parents first, so a mount inside
    // another mount lands inside it (its mount point made inside that volume, as the kubelet
    // does).
    let mut ordered: Vec<&BindMount> = spec.mounts.iter().collect();
    ordered.sort_by_key(|m| m.target.components().count());
    let mut sources: Vec<CString> = vec![];
    let mut mounts: Vec<PreparedMount> = vec![];
    for (i, m) in ordered.iter().enumerate() {
        let target = inside(Path::new("/"), &m.target);
        let is_dir = m.source.is_dir();
        let dirs_up_to = if is_dir {
            Some(target.as_path())
        } else {
            target.parent()
        };
        let dirs = match dirs_up_to {
            Some(d) => prefixes_below(Path::new("/"), d)
                .iter()
                .map(|p| cstring(p))
                .collect::<io::Result<_>>()?,
            None => vec![],
        };
        sources.push(cstring(&m.source)?);
        mounts.push(PreparedMount {
            dirs,
            file: if is_dir { None } else { Some(cstring(&target)?) },
            parked: cstring(&PathBuf::from(format!("/proc/self/fd/{}", PARKED_FD_BASE + i as i32)))?,
            target: cstring(&target)?,
            read_only: m.read_only,
        });
    }
    let working_dirs: Vec<CString> = match &spec.working_dir {
        Some(dir) => prefixes_below(Path::new("/"), dir)
            .iter()
            .map(|p| cstring(p))
            .collect::<io::Result<_>>()?,
        None => vec![],
    };
    let hostname = spec.hostname.clone().unwrap_or_default().into_bytes();
    let workdir = spec.working_dir.as_deref().map(cstring).transpose()?;
    let slash = cstring(Path::new("/"))?;
    let dot = cstr(".")?;
    let old_root_c = cstring(&root.join(OLD_ROOT))?;
    let old_root_rel = cstr(OLD_ROOT)?;
    let old_root_abs = cstring(&Path::new("/").join(OLD_ROOT))?;
    let groups: Vec<libc::gid_t> = spec.supplementary_groups.clone();
    let (uid, gid) = (spec.uid, spec.gid);

    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .kill_on_drop(false);
    // SAFETY: the closure runs in the forked child before exec and only makes system calls on
    // memory that was allocated before the fork; it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            let null = std::ptr::null::<libc::c_char>();
            let bind = |source: &CString, target: &CString, read_only: bool| -> io::Result<()> {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                if read_only {
                    check(libc::mount(
                        null,
                        target.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ))?;
                }
                Ok(())
            };
            check(libc::setsid())?;
            if let Some(fd) = netns_fd {
                check(libc::setns(fd, libc::CLONE_NEWNET))?;
            }
            check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
            // Slave, not private: unmounts on the host (such as a deleted netns) reach us too.
            check(libc::mount(
                null,
                slash.as_ptr(),
                null,
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ))?;
            if !hostname.is_empty() {
                check(libc::sethostname(hostname.as_ptr().cast(), hostname.len()))?;
            }
            for (i, source) in sources.iter().enumerate() {
                let fd = libc::open(source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                check(fd)?;
                check(libc::dup3(fd, PARKED_FD_BASE + i as i32, libc::O_CLOEXEC))?;
                check(libc::close(fd))?;
            }
            // The container's root: this machine's root, read-only, under its own layer.
            check(libc::mount(
                overlay.as_ptr(),
                root_c.as_ptr(),
                overlay.as_ptr(),
                0,
                overlay_options.as_ptr().cast(),
            ))?;
            let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
            check(libc::mount(
                proc_fs.as_ptr(),
                proc_c.as_ptr(),
                proc_fs.as_ptr(),
                nosuid_nodev | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                sysfs.as_ptr(),
                sys_c.as_ptr(),
                sysfs.as_ptr(),
                nosuid_nodev | libc::MS_NOEXEC | libc::MS_RDONLY,
                std::ptr::null(),
            ))?;
            bind(&host_dev, &dev_c, false)?;
            check(libc::mount(
                tmpfs.as_ptr(),
                shm_c.as_ptr(),
                tmpfs.as_ptr(),
                nosuid_nodev,
                shm_options.as_ptr().cast(),
            ))?;
            for (source, target) in &host_binds {
                bind(source, target, true)?;
            }
            // Into the new root, with the old one kept at a mount point inside it until the
            // volumes are mounted (a source on a detached mount cannot be bound), then detached,
            // so nothing of it stays reachable.
            mkdir_if_missing(&old_root_c)?;
            check(libc::chdir(root_c.as_ptr()))?;
            check(libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), old_root_rel.as_ptr()) as libc::c_int)?;
            check(libc::chdir(slash.as_ptr()))?;
            for m in &mounts {
                for dir in &m.dirs {
                    mkdir_if_missing(dir)?;
                }
                if let Some(file) = &m.file {
                    let fd = libc::open(file.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
                    check(fd)?;
                    check(libc::close(fd))?;
                }
                bind(&m.parked, &m.target, m.read_only)?;
            }
            check(libc::umount2(old_root_abs.as_ptr(), libc::MNT_DETACH))?;
            check(libc::rmdir(old_root_abs.as_ptr()))?;
            for dir in &working_dirs {
                mkdir_if_missing(dir)?;
            }
            if uid.is_some() || gid.is_some() {
                check(libc::setgroups(groups.len(), groups.as_ptr()))?;
            }
            if let Some(gid) = gid {
                check(libc::setgid(gid))?;
            }
            if let Some(uid) = uid {
                check(libc::setuid(uid))?;
            }
            if let Some(dir) = &workdir {
                check(libc::chdir(dir.as_ptr()))?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    drop(netns);
    child
}

/// Sends `signal` to the process group led by `pid` (every container runs in its own session).
pub fn signal_group(pid: u32, signal: nix::sys::signal::Signal) -> nix::Result<()> {
    let pgid = nix::unistd::Pid::from_raw(pid as i32);
    match nix::sys::signal::killpg(pgid, signal) {
        Err(nix::errno::Errno::ESRCH) => Ok(()),
        other => other,
    }
}

/// Records a container's process (group) in `<pod dir>/pids/<container>`, so that an agent
/// started later can stop what it left running.
pub fn record_pid(pod_dir: &Path, container: &str, pid: u32) {
    let dir = pod_dir.join("pids");
    let _ = std::fs::create_dir_all(&dir);
    if let Some(start) = process_start_time(pid) {
        let _ = std::fs::write(dir.join(container), format!("{pid} {start}"));
    }
}

/// The start time of a process in clock ticks since boot (from /proc), which tells a recorded
/// pid apart from a later process that reused the number.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: count fields after it.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Kills the process groups recorded in a pod folder whose processes still run.
pub fn kill_recorded_processes(pod_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(pod_dir.join("pids")) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut parts = text.split_whitespace();
        let (Some(pid), Some(start)) = (parts.next().and_then(|p| p.parse::<u32>().ok()), parts.next()) else {
            continue;
        };
        // The group may outlive its leader. While any member lives, its number cannot be given
        // to a new process, so signalling the group is safe unless the number now belongs to a
        // different process (another start time).
        let leader_start = process_start_time(pid).map(|s| s.to_string());
        if leader_start.is_none() || leader_start.as_deref() == Some(start) {
            tracing::info!(pid, "stopping container processes left by an earlier agent");
            let _ = signal_group(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = std::fs::remove_file(entry.path());
    }
}

/// Runs a command inside a running container's namespaces (for exec probes), with a timeout.
/// Returns the exit code, or `None` if it timed out.
pub async fn exec_in(
    pid: u32,
    command: &[String],
    env: &[(String, String)],
    timeout: std::time::Duration,
) -> io::Result<Option<i32>> {
    let Some((program, args)) = command.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty exec command"));
    };
    // nsenter joins the container's mount, UTS and network namespaces, as the container's user.
    let (uid, gid) = process_ids(pid)?;
    let target = pid.to_string();
    let mut cmd = Command::new("nsenter");
    cmd.args(["--target", &target, "--mount", "--uts", "--net"])
        .args([
            "--setuid",
            &uid.to_string(),
            "--setgid",
            &gid.to_string(),
            "--wdns=/",
            "--",
        ])
        .arg(program)
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => Ok(Some(status?.code().unwrap_or(-1))),
        Err(_) => {
            let _ = child.kill().await;
            Ok(None)
        }
    }
}

/// The real uid and gid of a running process, from /proc.
fn process_ids(pid: u32) -> io::Result<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no {name} in /proc/{pid}/status")))
    };
    Ok((field("Uid:")?, field("Gid:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_sub_paths_are_made_inside_their_volumes_and_nothing_else_on_the_host() {
        let base = std::env::temp_dir().join(format!("noops-mounts-{}", std::process::id()));
        let config = base.join("vol-config");
        std::fs::create_dir_all(&config).unwrap();
        let mounts = vec![BindMount {
            source: config.join("sub"),
            target: base.join("nowhere/config"),
            read_only: true,
        }];
        prepare_mount_sources(&mounts).unwrap();
        assert!(config.join("sub").is_dir(), "missing subPath created");
        assert!(!base.join("nowhere").exists(), "no mount point made on the host");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn container_paths_map_into_the_root() {
        let root = Path::new("/pods/u/containers/app/root");
        assert_eq!(inside(root, Path::new("/var/lib/etcd")), root.join("var/lib/etcd"));
        assert_eq!(inside(root, Path::new("/../etc")), root.join("etc"), "no way out");
        assert_eq!(
            prefixes_below(root, &root.join("a/b")),
            vec![root.join("a"), root.join("a/b")]
        );
    }

    #[test]
    fn other_file_systems_are_listed_once_without_kernel_interfaces() {
        let mountinfo = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
42 27 254:0 /run/netns /run/netns rw,relatime shared:1 - ext4 /dev/vda rw
43 42 0:4 net:[4026532] /run/netns/noops-node-1-abc rw shared:1 - nsfs nsfs rw
50 27 254:1 / /home rw,relatime - xfs /dev/vdb rw
51 50 254:2 / /home/data rw,relatime - xfs /dev/vdc rw
52 27 0:40 / /mnt/with\\040space ro,relatime - tmpfs tmpfs ro
";
        assert_eq!(
            host_mounts(mountinfo),
            vec![PathBuf::from("/home"), PathBuf::from("/mnt/with space")]
        );
    }
}
