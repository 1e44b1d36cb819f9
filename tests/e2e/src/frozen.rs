//! A pod frozen whole by the cgroup v2 freezer, as a hung node or a paused VM leaves it: its
//! processes run no instruction and answer nothing, yet none exits (a process the node agent
//! starts again in it is frozen too). Thawed when dropped.

use std::path::{Path, PathBuf};

/// Where cgroup v2 may be mounted.
const CGROUP_ROOTS: [&str; 2] = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];

pub struct Frozen {
    freeze_file: PathBuf,
}

impl Frozen {
    /// Freezes cgroup `cgroup` (a path from the hierarchy's root, as /proc/<pid>/cgroup names it).
    pub fn cgroup(cgroup: &Path) -> Self {
        let relative = cgroup.strip_prefix("/").unwrap_or(cgroup);
        let freeze_file = CGROUP_ROOTS
            .iter()
            .map(|root| Path::new(root).join(relative).join("cgroup.freeze"))
            .find(|f| f.exists())
            .unwrap_or_else(|| panic!("no cgroup.freeze for {}", cgroup.display()));
        Self::file(freeze_file)
    }

    /// Freezes the pod whose UID is `uid`: the node agent keeps each pod's processes in a
    /// cgroup `<its own>/pods/<uid>` (crates/node-agent/src/cgroups.rs); a real node's kubelet
    /// (cgroupfs) in `…/kubepods/<qos class>/pod<uid>`, which runc mirrors in the v2 tree.
    pub fn pod_uid(uid: &str) -> Self {
        let dir = CGROUP_ROOTS
            .iter()
            .find_map(|root| find_dir(Path::new(root), uid, 10))
            .unwrap_or_else(|| panic!("no cgroup of pod {uid}"));
        Self::file(dir.join("cgroup.freeze"))
    }

    /// Freezes the cgroup of `freeze_file` and returns once it is frozen: a process in the
    /// middle of a write to disk is frozen only once the write is done, and on a loaded
    /// machine that can take seconds (a server's backend may acknowledge a commit meanwhile).
    fn file(freeze_file: PathBuf) -> Self {
        std::fs::write(&freeze_file, "1").unwrap_or_else(|e| panic!("{}: {e}", freeze_file.display()));
        let events = freeze_file.with_file_name("cgroup.events");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            let said = std::fs::read_to_string(&events).unwrap_or_default();
            if said.lines().any(|l| l.trim() == "frozen 1") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Self { freeze_file }
    }

    pub fn thaw(self) {}
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.freeze_file, "0");
    }
}

/// The folder `pods/<uid>` (the node agent's) or `pod<uid>` (the kubelet's) under `dir`, at
/// most `depth` levels down.
fn find_dir(dir: &Path, uid: &str, depth: usize) -> Option<PathBuf> {
    let wanted = [dir.join("pods").join(uid), dir.join(format!("pod{uid}"))];
    if let Some(found) = wanted.into_iter().find(|w| w.is_dir()) {
        return Some(found);
    }
    if depth == 0 {
        return None;
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| find_dir(&e.path(), uid, depth - 1))
}
