//! Starting a container process inside its pod's sandbox.
//!
//! A container is a plain process on this machine, placed in:
//! - the pod's network namespace (so it listens on the pod IP and standard ports),
//! - its own mount namespace, with a root file system of its own (`rootfs.rs`),
//! - its own UTS namespace with the pod's hostname,
//! - its own session, so that the whole process group can be signalled,
//! - with only the capabilities a container runtime grants by default (unless privileged).
//!
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

use crate::rootfs::{BindMount, RootFsPlan};

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
    /// Paths of this machine the container must not read (the cluster's state and keys).
    pub hidden: Vec<PathBuf>,
    /// The capabilities it may have; `None` keeps them all (a privileged container).
    pub capabilities: Option<Vec<u32>>,
    /// stdout and stderr are appended here.
    pub log_file: PathBuf,
    /// The container's cgroup (`cgroups.rs`): the process joins it before anything else, so
    /// every process it starts is in it too.
    pub cgroup: Option<PathBuf>,
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

/// The highest capability number this kernel knows.
fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

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
    prepare_mount_sources(&spec.mounts)?;
    if let Some(parent) = spec.log_file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let log = OpenOptions::new().create(true).append(true).open(&spec.log_file)?;
    let log_err = log.try_clone()?;

    // Everything the child needs, prepared before fork.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut rootfs = RootFsPlan::prepare(
        &spec.layer_dir,
        &spec.mounts,
        &mountinfo,
        &spec.hidden,
        spec.working_dir.as_deref(),
    )?;
    let cgroup_procs: Option<File> = match &spec.cgroup {
        Some(dir) => Some(OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?),
        None => None,
    };
    let cgroup_fd = cgroup_procs.as_ref().map(|f| f.as_raw_fd());
    let netns: Option<OwnedFd> = match &spec.netns {
        Some(path) => Some(File::open(path)?.into()),
        None => None,
    };
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());
    let dropped_capabilities: Vec<libc::c_ulong> = match &spec.capabilities {
        None => vec![],
        Some(kept) => (0..=last_capability())
            .filter(|c| !kept.contains(c))
            .map(libc::c_ulong::from)
            .collect(),
    };
    let hostname = spec.hostname.clone().unwrap_or_default().into_bytes();
    let workdir = spec.working_dir.as_deref().map(cstring).transpose()?;
    let slash = cstring(Path::new("/"))?;
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
            if let Some(fd) = cgroup_fd {
                // "0" moves the writing process.
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            check(libc::setsid())?;
            if let Some(fd) = netns_fd {
                check(libc::setns(fd, libc::CLONE_NEWNET))?;
            }
            check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
            // Slave, not private: unmounts on the host (such as a deleted netns) reach us too.
            check(libc::mount(
                std::ptr::null(),
                slash.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ))?;
            if !hostname.is_empty() {
                check(libc::sethostname(hostname.as_ptr().cast(), hostname.len()))?;
            }
            rootfs.enter()?;
            // Out of the bounding set: exec gives the program none of these, whatever its user.
            for cap in &dropped_capabilities {
                check(libc::prctl(libc::PR_CAPBSET_DROP, *cap, 0, 0, 0))?;
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
    drop(cgroup_procs);
    child
}

/// Checks that this machine can give containers their root (overlayfs with the layers under
/// `state_dir`, and the system calls used to build it), by running `/bin/sh -c :` in one.
pub async fn self_check(state_dir: &Path) -> io::Result<()> {
    let dir = state_dir.join("self-check");
    let _ = std::fs::remove_dir_all(&dir);
    let spec = ProcessSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), ":".into()],
        env: vec![],
        layer_dir: dir.join("layer"),
        log_file: dir.join("log"),
        capabilities: Some(vec![]),
        ..Default::default()
    };
    let outcome = match spawn(&spec) {
        Ok(mut child) => child.wait().await.map(|status| status.success()),
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Ok(true) => Ok(()),
        Ok(false) => Err(io::Error::other("the test container exited with an error")),
        Err(e) => Err(e),
    }
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
    fn the_kernel_names_its_capabilities() {
        assert!(
            last_capability() >= 37,
            "CAP_AUDIT_READ and later exist on any kernel we run on"
        );
    }
}
