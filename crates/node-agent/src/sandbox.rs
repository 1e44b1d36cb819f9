//! Starting a container process inside its pod's sandbox.
//!
//! A container is a plain process on this machine, placed in:
//! - the pod's network namespace (so it listens on the pod IP and standard ports),
//! - its own mount namespace, where the pod's volumes, `/etc/hosts` and `/etc/resolv.conf` are
//!   bind-mounted at the paths the pod spec names (so in-cluster clients find their token at
//!   `/var/run/secrets/kubernetes.io/serviceaccount`),
//! - its own UTS namespace with the pod's hostname,
//! - its own session, so that the whole process group can be signalled.
//!
//! There is no file-system isolation beyond those mounts: the process sees this machine's files.
//! Everything the child does between fork and exec is plain system calls on data prepared
//! beforehand, because only async-signal-safe work is allowed there.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
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
    /// stdout and stderr are appended here.
    pub log_file: PathBuf,
}

/// Prepares mount points: a bind mount needs an existing source and an existing target of the
/// same kind. A missing source (a `subPath` not created yet) becomes an empty folder, as the
/// kubelet does. A target inside another mount is created inside that mount's source, since
/// that is where it will be looked up; other targets are created on the host as empty folders
/// or files and left in place (they are harmless and shared by every pod using the same path).
pub fn prepare_mount_points(mounts: &[BindMount]) -> io::Result<()> {
    for m in mounts {
        if !m.source.exists() {
            std::fs::create_dir_all(&m.source)?;
        }
    }
    for m in mounts {
        let parent = mounts
            .iter()
            .filter(|p| p.target != m.target && m.target.starts_with(&p.target))
            .max_by_key(|p| p.target.components().count());
        let target = match parent.and_then(|p| m.target.strip_prefix(&p.target).ok().map(|rest| p.source.join(rest))) {
            Some(inside) => inside,
            None => m.target.clone(),
        };
        if target.exists() {
            continue;
        }
        if m.source.is_dir() {
            std::fs::create_dir_all(&target)?;
        } else {
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir)?;
            }
            File::create(&target)?;
        }
    }
    Ok(())
}

/// Descriptors from here up hold mount sources in the child between fork and exec.
const PARKED_FD_BASE: i32 = 900;

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Starts the process described by `spec`.
pub fn spawn(spec: &ProcessSpec) -> io::Result<Child> {
    prepare_mount_points(&spec.mounts)?;
    if let Some(parent) = spec.log_file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let log = OpenOptions::new().create(true).append(true).open(&spec.log_file)?;
    let log_err = log.try_clone()?;

    // Everything the child needs, prepared before fork.
    let netns: Option<OwnedFd> = match &spec.netns {
        Some(path) => Some(File::open(path)?.into()),
        None => None,
    };
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());
    // Mounts happen in two steps inside the child: first every source is opened (O_PATH) and
    // parked on a fixed descriptor, then each is bind-mounted from /proc/self/fd. An earlier
    // mount (say an emptyDir over /work) could otherwise hide the path of a later source.
    // Targets are mounted parents first, so a mount inside another mount lands inside it.
    let mut ordered: Vec<&BindMount> = spec.mounts.iter().collect();
    ordered.sort_by_key(|m| m.target.components().count());
    let mut mounts: Vec<(CString, CString, CString, bool)> = vec![];
    for (i, m) in ordered.iter().enumerate() {
        let parked = PathBuf::from(format!("/proc/self/fd/{}", PARKED_FD_BASE + i as i32));
        mounts.push((cstring(&m.source)?, cstring(&parked)?, cstring(&m.target)?, m.read_only));
    }
    let hostname = spec.hostname.clone().unwrap_or_default().into_bytes();
    let workdir = spec.working_dir.as_deref().map(cstring).transpose()?;
    let root = cstring(Path::new("/"))?;
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
            check(libc::setsid())?;
            if let Some(fd) = netns_fd {
                check(libc::setns(fd, libc::CLONE_NEWNET))?;
            }
            check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
            // Slave, not private: unmounts on the host (such as a deleted netns) reach us too.
            check(libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ))?;
            if !hostname.is_empty() {
                check(libc::sethostname(hostname.as_ptr().cast(), hostname.len()))?;
            }
            for (i, (source, _, _, _)) in mounts.iter().enumerate() {
                let fd = libc::open(source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                check(fd)?;
                check(libc::dup3(fd, PARKED_FD_BASE + i as i32, libc::O_CLOEXEC))?;
                check(libc::close(fd))?;
            }
            for (_, parked, target, read_only) in &mounts {
                check(libc::mount(
                    parked.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                if *read_only {
                    check(libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ))?;
                }
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
    fn nested_targets_and_sub_paths_are_made_inside_their_volumes() {
        let base = std::env::temp_dir().join(format!("noops-mounts-{}", std::process::id()));
        let data = base.join("vol-data");
        let config = base.join("vol-config");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&config).unwrap();
        let target = base.join("root/data");
        let mounts = vec![
            BindMount {
                source: data.clone(),
                target: target.clone(),
                read_only: false,
            },
            BindMount {
                source: config.join("sub"),
                target: target.join("config"),
                read_only: true,
            },
        ];
        prepare_mount_points(&mounts).unwrap();
        assert!(config.join("sub").is_dir(), "missing subPath created");
        assert!(
            data.join("config").is_dir(),
            "nested mount point made inside the parent volume"
        );
        assert!(target.is_dir(), "top-level mount point made on the host");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
