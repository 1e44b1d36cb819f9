//! One cgroup (v2) per container, so that stopping a container ends every process it started.
//!
//! A process group is not enough: a process that calls `setsid` (a daemon, a nested node agent's
//! containers) leaves it, and would outlive its pod. A cgroup cannot be left without privileges
//! a container does not have, and `cgroup.kill` ends all of it, children cgroups included, at
//! once. The cgroups go under the agent's own (`<own>/pods/<pod uid>/<container>`), so an
//! agent that runs inside a container (a Machine) keeps its pods inside that container's cgroup,
//! and whatever ends that container ends them too. No controller is enabled: the cgroups only
//! hold processes.
//!
//! Without a cgroup v2 hierarchy (and no right to mount one) the agent falls back to process
//! groups and says so at start.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::warn;

/// The folder under the agent's own cgroup that holds its pods' cgroups.
const PODS: &str = "pods";

/// Where this agent's pod cgroups live, if it has a cgroup v2 hierarchy to use.
#[derive(Debug, Clone)]
pub struct Cgroups {
    pods: Option<PathBuf>,
}

impl Cgroups {
    /// Finds the agent's own cgroup v2 folder and prepares `pods` under it. Without a cgroup2
    /// mount in view (a container gets a fresh `/sys`), one is mounted at `<state_dir>/cgroup`.
    pub fn detect(state_dir: &Path) -> Self {
        match Self::find_or_mount(state_dir) {
            Ok(own) => {
                let pods = own.join(PODS);
                match std::fs::create_dir_all(&pods) {
                    Ok(()) => Self { pods: Some(pods) },
                    Err(e) => {
                        warn!(path = %pods.display(), error = %e, "cannot make pod cgroups; a process that leaves its process group can outlive its pod");
                        Self { pods: None }
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "no cgroup v2 hierarchy; a process that leaves its process group can outlive its pod");
                Self { pods: None }
            }
        }
    }

    fn find_or_mount(state_dir: &Path) -> io::Result<PathBuf> {
        let own = std::fs::read_to_string("/proc/self/cgroup")?;
        let own = own_cgroup(&own).ok_or_else(|| io::Error::other("no cgroup v2 entry in /proc/self/cgroup"))?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        if let Some((root, point)) = cgroup2_mount(&mountinfo)
            && let Some(path) = own_path(&point, &root, &own)
        {
            return Ok(path);
        }
        let point = state_dir.join("cgroup");
        std::fs::create_dir_all(&point)?;
        nix::mount::mount(
            Some("cgroup2"),
            &point,
            Some("cgroup2"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(io::Error::from)?;
        own_path(&point, "/", &own).ok_or_else(|| io::Error::other("own cgroup outside the mounted hierarchy"))
    }

    /// Whether containers get cgroups.
    pub fn enabled(&self) -> bool {
        self.pods.is_some()
    }

    fn pod_dir(&self, pod_uid: &str) -> Option<PathBuf> {
        self.pods.as_ref().map(|p| p.join(pod_uid))
    }

    /// The (created) cgroup of one container, emptied of anything an earlier instance left.
    pub fn container(&self, pod_uid: &str, container: &str) -> io::Result<Option<PathBuf>> {
        let Some(dir) = self.pod_dir(pod_uid).map(|d| d.join(container)) else {
            return Ok(None);
        };
        std::fs::create_dir_all(&dir)?;
        kill(&dir);
        Ok(Some(dir))
    }

    /// Kills every process of a pod (what an earlier agent left running).
    pub fn kill_pod(&self, pod_uid: &str) {
        if let Some(dir) = self.pod_dir(pod_uid).filter(|d| d.exists()) {
            kill(&dir);
        }
    }

    /// Kills every process of a pod and removes its cgroups (waiting a moment for the killed
    /// processes to leave them).
    pub async fn remove_pod(&self, pod_uid: &str) {
        let Some(dir) = self.pod_dir(pod_uid) else { return };
        if !dir.exists() {
            return;
        }
        kill(&dir);
        for _ in 0..50 {
            if remove_tree(&dir).is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        warn!(path = %dir.display(), "processes of a pod are still in its cgroup after it was killed");
    }

    /// The pods (UIDs) that have cgroups here.
    pub fn pod_uids(&self) -> Vec<String> {
        let Some(pods) = &self.pods else { return vec![] };
        std::fs::read_dir(pods)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Kills every process in a cgroup and its children cgroups. `cgroup.kill` (Linux 5.14) does it
/// at once; on older kernels each listed process is killed, a few rounds to catch forks.
pub fn kill(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for _ in 0..5 {
        let pids = procs_in_tree(dir);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Waits, at most `limit`, until no process is left in a cgroup (its tree included): the next
/// instance of a container must not meet what the last one left (a port still bound, a lock
/// file naming a process not gone yet). False if some remain.
pub async fn wait_empty(dir: &Path, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let populated = std::fs::read_to_string(dir.join("cgroup.events"))
            .map(|e| e.lines().any(|l| l.trim() == "populated 1"))
            .unwrap_or_else(|_| !procs_in_tree(dir).is_empty());
        if !populated {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn procs_in_tree(dir: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                out.extend(procs_in_tree(&e.path()));
            }
        }
    }
    out
}

/// Removes a cgroup and its children, deepest first (a cgroup folder goes with `rmdir`, which
/// fails while a process is still in it).
fn remove_tree(dir: &Path) -> io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.path().is_dir() {
            remove_tree(&e.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The agent's cgroup v2 path (`0::<path>` in `/proc/self/cgroup`). Pure.
fn own_cgroup(proc_self_cgroup: &str) -> Option<String> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// The first cgroup2 mount: (its root inside the hierarchy, its mount point). Pure.
fn cgroup2_mount(mountinfo: &str) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let fstype = fields.iter().skip_while(|f| **f != "-").nth(1)?;
        if *fstype != "cgroup2" {
            return None;
        }
        Some((fields.get(3)?.to_string(), PathBuf::from(fields.get(4)?)))
    })
}

/// Where cgroup `own` appears under a mount of the hierarchy's `root` at `point`. Pure.
fn own_path(point: &Path, root: &str, own: &str) -> Option<PathBuf> {
    let relative = Path::new(own).strip_prefix(root).ok()?;
    Some(point.join(relative))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_cgroup_is_found_under_the_cgroup2_mount() {
        let cgroup = "9:name=systemd:/\n8:pids:/\n0::/noops/noops-node-2\n";
        assert_eq!(own_cgroup(cgroup).as_deref(), Some("/noops/noops-node-2"));
        assert_eq!(own_cgroup("8:pids:/\n"), None, "cgroup v1 only");
        let mountinfo = "25 30 0:22 / /sys rw - sysfs sysfs rw\n\
                         40 25 0:35 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
        let (root, point) = cgroup2_mount(mountinfo).unwrap();
        assert_eq!(
            own_path(&point, &root, "/noops/noops-node-2"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/noops/noops-node-2"))
        );
        // Mounted from inside a cgroup namespace: the mount shows a subtree.
        assert_eq!(
            own_path(Path::new("/sys/fs/cgroup"), "/machine", "/machine/agent"),
            Some(PathBuf::from("/sys/fs/cgroup/agent"))
        );
        assert_eq!(own_path(Path::new("/c"), "/machine", "/elsewhere"), None);
        assert_eq!(cgroup2_mount("25 30 0:22 / /sys rw - sysfs sysfs rw\n"), None);
    }
}
