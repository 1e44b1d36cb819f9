//! A container's root file system: this machine's root as the read-only lower layer of an
//! overlay, with a writable upper layer of the container's own on top (kept in the pod's folder
//! across restarts of the container, removed with the pod). Inside it:
//! - fresh `/proc` and `/sys` (read-only), and a `/dev` of its own with only the harmless
//!   devices (`null`, `zero`, `full`, `random`, `urandom`, `tty`), a private `devpts` and a
//!   `/dev/shm`;
//! - this machine's other file systems read-only (all of each tree), tmpfs ones fresh and
//!   empty, network and FUSE ones left out;
//! - the folders this machine keeps private (the cluster's state and keys) hidden;
//! - the pod's volumes, `/etc/hosts` and `/etc/resolv.conf` at the paths the spec names.
//!
//! Everything is prepared by [`RootFsPlan::prepare`] before the fork; [`RootFsPlan::enter`]
//! runs in the child between fork and exec and only makes system calls on that data. Sources
//! are cloned as detached mounts while this machine's files are in view; then the process
//! pivots into the new root and detaches the old one, and only then are mount points made and
//! the clones attached. So a path a container controls (a symlink in its layer) can only lead
//! somewhere inside its own root, never onto this machine's files.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// A bind mount into the container's view of the file system.
#[derive(Debug, Clone, PartialEq)]
pub struct BindMount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// File systems that stay as they are (fresh ones are mounted, or they are kernel interfaces).
const KERNEL_ROOTS: [&str; 3] = ["/proc", "/sys", "/dev"];
/// File system types a container never gets: they can hang or refuse a clone (network, FUSE,
/// automount), or are namespace handles.
const LEFT_OUT_TYPES: [&str; 8] = ["nsfs", "autofs", "fuse", "nfs", "nfs4", "cifs", "smb3", "9p"];

/// A file system of this machine other than its root, as a container gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMount {
    pub point: PathBuf,
    /// A tmpfs: the container gets a fresh empty one instead (it holds this machine's runtime
    /// state, and a container writes there, e.g. under `/run` or `/tmp`).
    pub fresh_tmpfs: bool,
}

/// The file systems of this machine, other than `/`, that a container should see: the overlay
/// shows only the root file system, so without them their folders would be empty. Kernel
/// interfaces, namespace handles, network and FUSE file systems are left out, and so is a mount
/// inside another one listed (the recursive clone brings it along). `mountinfo` is
/// `/proc/self/mountinfo`. Pure.
pub fn host_mounts(mountinfo: &str) -> Vec<HostMount> {
    let mut mounts: Vec<HostMount> = mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = fields.get(4)?;
            let fstype = fields.iter().skip_while(|f| **f != "-").nth(1)?;
            Some((unescape_mount_path(point), *fstype))
        })
        .filter(|(point, fstype)| {
            point != Path::new("/")
                && !LEFT_OUT_TYPES.contains(fstype)
                && !fstype.starts_with("fuse.")
                && !point.starts_with("/run/netns")
                && !KERNEL_ROOTS.iter().any(|p| point.starts_with(p))
        })
        .map(|(point, fstype)| HostMount {
            point,
            fresh_tmpfs: fstype == "tmpfs",
        })
        .collect();
    mounts.sort_by(|a, b| a.point.cmp(&b.point));
    mounts.dedup_by(|a, b| a.point == b.point);
    let points: Vec<PathBuf> = mounts.iter().map(|m| m.point.clone()).collect();
    mounts.retain(|m| {
        !points
            .iter()
            .any(|other| *other != m.point && m.point.starts_with(other))
    });
    mounts
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

/// `path` as an absolute path of the container, without `..` (a spec cannot climb out).
fn in_container(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        if let Component::Normal(part) = c {
            out.push(part);
        }
    }
    out
}

/// Every prefix of the absolute `path`, shortest first: what `mkdir -p` creates.
fn prefixes(path: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut current = PathBuf::from("/");
    for c in path.components() {
        if let Component::Normal(part) = c {
            current.push(part);
            out.push(current.clone());
        }
    }
    out
}

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

fn check_fd(rc: libc::c_long) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as libc::c_int)
    }
}

/// The characters an overlay option value cannot hold (they separate options and layers).
fn usable_in_overlay_options(path: &Path) -> bool {
    !path
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|b| matches!(b, b',' | b':' | b'\\'))
}

/// One mount point to make and fill inside the new root.
struct Target {
    /// Folders to create (`mkdir -p`), shortest first.
    dirs: Vec<CString>,
    /// The mount point itself is a file (the source is one).
    file: bool,
    path: CString,
}

impl Target {
    fn new(path: &Path, file: bool) -> io::Result<Self> {
        let up_to = if file { path.parent() } else { Some(path) };
        let dirs = up_to
            .map(prefixes)
            .unwrap_or_default()
            .iter()
            .map(|p| cstring(p))
            .collect::<io::Result<_>>()?;
        Ok(Self {
            dirs,
            file,
            path: cstring(path)?,
        })
    }

    /// Creates the mount point (in the new root). A file mount point that is a symlink (say
    /// `/etc/resolv.conf` pointing into `/run`) is replaced by an empty file in the container's
    /// layer, as container runtimes do.
    fn make(&self) -> io::Result<()> {
        for dir in &self.dirs {
            // SAFETY: a system call on a NUL-terminated path prepared before the fork.
            if unsafe { libc::mkdir(dir.as_ptr(), 0o755) } == -1 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e);
                }
            }
        }
        if !self.file {
            return Ok(());
        }
        // SAFETY: system calls on prepared paths and a zeroed stat buffer on the stack.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::lstat(self.path.as_ptr(), &mut st) == 0 {
                if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                    return Ok(());
                }
                check(libc::unlink(self.path.as_ptr()))?;
            }
            let fd = libc::open(
                self.path.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o644,
            );
            check(fd)?;
            check(libc::close(fd))
        }
    }
}

/// A tree cloned before the pivot and attached after it.
struct Clone {
    source: CString,
    read_only: bool,
    target: Target,
    /// A failed clone is skipped (this machine's other file systems) or fails the start (a
    /// volume).
    required: bool,
}

/// A device node of the container's `/dev`.
struct Device {
    path: CString,
    major: u32,
    minor: u32,
}

/// Everything the child needs to build and enter a container's root, prepared before the fork.
pub struct RootFsPlan {
    root: CString,
    old_root: CString,
    overlay_options: CString,
    strings: Strings,
    clones: Vec<Clone>,
    /// The descriptors of the clones, filled in by the child (allocated here, before the fork).
    clone_fds: Vec<libc::c_int>,
    fresh_tmpfs: Vec<(Target, CString)>,
    devices: Vec<Device>,
    dev_links: Vec<(CString, CString)>,
    /// Folders (an empty read-only tmpfs goes over them) and files (`/dev/null` goes over them)
    /// of this machine that containers must not read.
    hidden: Vec<Target>,
    working_dir: Option<Target>,
}

/// Fixed names and options, made into C strings once.
struct Strings {
    slash: CString,
    dot: CString,
    empty: CString,
    overlay: CString,
    proc_: CString,
    sysfs: CString,
    tmpfs: CString,
    devpts: CString,
    proc_dir: CString,
    sys_dir: CString,
    dev_dir: CString,
    pts_dir: CString,
    shm_dir: CString,
    dev_options: CString,
    pts_options: CString,
    shm_options: CString,
    hidden_options: CString,
    null_device: CString,
}

impl Strings {
    fn new() -> io::Result<Self> {
        Ok(Self {
            slash: cstr("/")?,
            dot: cstr(".")?,
            empty: cstr("")?,
            overlay: cstr("overlay")?,
            proc_: cstr("proc")?,
            sysfs: cstr("sysfs")?,
            tmpfs: cstr("tmpfs")?,
            devpts: cstr("devpts")?,
            proc_dir: cstr("/proc")?,
            sys_dir: cstr("/sys")?,
            dev_dir: cstr("/dev")?,
            pts_dir: cstr("/dev/pts")?,
            shm_dir: cstr("/dev/shm")?,
            dev_options: cstr("mode=755,size=64k")?,
            pts_options: cstr("newinstance,ptmxmode=0666,mode=0620")?,
            shm_options: cstr("mode=1777,size=65536k")?,
            hidden_options: cstr("mode=000,size=4k")?,
            null_device: cstr("/dev/null")?,
        })
    }
}

/// Where this machine's root stays, inside the new root, between the pivot and its detach.
const OLD_ROOT: &str = ".noops-old-root";

impl RootFsPlan {
    /// Plans the root of a container whose layer lives in `layer_dir` (`upper`, `work`, and
    /// `root`, the mount point), with `mounts` (volumes), this machine's file systems as
    /// `mountinfo` lists them, the folders to keep `hidden`, and the `working_dir` to create.
    pub fn prepare(
        layer_dir: &Path,
        mounts: &[BindMount],
        mountinfo: &str,
        hidden: &[PathBuf],
        working_dir: Option<&Path>,
    ) -> io::Result<Self> {
        if !usable_in_overlay_options(layer_dir) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} holds ',', ':' or '\\', which overlayfs options cannot",
                    layer_dir.display()
                ),
            ));
        }
        let root = layer_dir.join("root");
        for dir in ["upper", "work", "root"] {
            std::fs::create_dir_all(layer_dir.join(dir))?;
        }
        let mut clones = vec![];
        let mut fresh_tmpfs = vec![];
        for m in host_mounts(mountinfo) {
            let target = Target::new(&m.point, false)?;
            if m.fresh_tmpfs {
                let mode = if m.point == Path::new("/tmp") { "1777" } else { "755" };
                fresh_tmpfs.push((target, cstr(&format!("mode={mode}"))?));
            } else {
                clones.push(Clone {
                    source: cstring(&m.point)?,
                    read_only: true,
                    target,
                    required: false,
                });
            }
        }
        // Volumes after this machine's file systems, parents before what they hold: a volume
        // inside another volume lands inside it (its mount point made inside that volume, as
        // the kubelet does).
        let mut volumes: Vec<&BindMount> = mounts.iter().collect();
        volumes.sort_by_key(|m| m.target.components().count());
        for m in volumes {
            clones.push(Clone {
                source: cstring(&m.source)?,
                read_only: m.read_only,
                target: Target::new(&in_container(&m.target), !m.source.is_dir())?,
                required: true,
            });
        }
        let devices = [
            ("null", 1, 3),
            ("zero", 1, 5),
            ("full", 1, 7),
            ("random", 1, 8),
            ("urandom", 1, 9),
            ("tty", 5, 0),
        ]
        .into_iter()
        .map(|(name, major, minor)| {
            Ok(Device {
                path: cstr(&format!("/dev/{name}"))?,
                major,
                minor,
            })
        })
        .collect::<io::Result<_>>()?;
        let dev_links = [
            ("/dev/fd", "/proc/self/fd"),
            ("/dev/stdin", "/proc/self/fd/0"),
            ("/dev/stdout", "/proc/self/fd/1"),
            ("/dev/stderr", "/proc/self/fd/2"),
            ("/dev/ptmx", "pts/ptmx"),
        ]
        .into_iter()
        .map(|(link, to)| Ok((cstr(link)?, cstr(to)?)))
        .collect::<io::Result<_>>()?;
        Ok(Self {
            overlay_options: cstr(&format!(
                "lowerdir=/,upperdir={},workdir={}",
                layer_dir.join("upper").display(),
                layer_dir.join("work").display()
            ))?,
            old_root: cstring(&root.join(OLD_ROOT))?,
            root: cstring(&root)?,
            strings: Strings::new()?,
            clone_fds: vec![-1; clones.len()],
            clones,
            fresh_tmpfs,
            devices,
            dev_links,
            hidden: hidden
                .iter()
                .filter(|p| p.exists())
                .map(|p| Target::new(&in_container(p), !p.is_dir()))
                .collect::<io::Result<_>>()?,
            working_dir: working_dir.map(|d| Target::new(&in_container(d), false)).transpose()?,
        })
    }

    /// Builds the root and makes it the process's root. Runs in the child between fork and exec,
    /// in a mount namespace of its own (private from this machine's: slave), before it drops
    /// privileges.
    ///
    /// # Safety
    /// Only async-signal-safe work: system calls on data prepared by [`RootFsPlan::prepare`].
    pub unsafe fn enter(&mut self) -> io::Result<()> {
        let s = &self.strings;
        let nothing = std::ptr::null::<libc::c_void>();
        // SAFETY: system calls on NUL-terminated strings and buffers prepared before the fork.
        unsafe {
            check(libc::mount(
                s.overlay.as_ptr(),
                self.root.as_ptr(),
                s.overlay.as_ptr(),
                0,
                self.overlay_options.as_ptr().cast(),
            ))?;
            // Clones of the sources, while this machine's files are still in view.
            for (clone, fd) in self.clones.iter().zip(self.clone_fds.iter_mut()) {
                let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint;
                let opened = check_fd(libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    clone.source.as_ptr(),
                    flags,
                ))
                .and_then(|tree| {
                    if clone.read_only {
                        let attr = libc::mount_attr {
                            attr_set: libc::MOUNT_ATTR_RDONLY,
                            attr_clr: 0,
                            propagation: 0,
                            userns_fd: 0,
                        };
                        check_fd(libc::syscall(
                            libc::SYS_mount_setattr,
                            tree,
                            s.empty.as_ptr(),
                            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
                            &attr as *const libc::mount_attr,
                            std::mem::size_of::<libc::mount_attr>(),
                        ))?;
                    }
                    Ok(tree)
                });
                match opened {
                    Ok(tree) => *fd = tree,
                    Err(e) if clone.required => return Err(e),
                    Err(_) => *fd = -1,
                }
            }
            // Into the new root; this machine's root is detached right away, so nothing below
            // can reach it.
            check(libc::mkdir(self.old_root.as_ptr(), 0o700)).or_else(|e| {
                if e.raw_os_error() == Some(libc::EEXIST) {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
            check(libc::chdir(self.root.as_ptr()))?;
            let old_root_relative = self.old_root.as_bytes().len() - OLD_ROOT.len();
            check(libc::syscall(
                libc::SYS_pivot_root,
                s.dot.as_ptr(),
                self.old_root.as_ptr().add(old_root_relative),
            ) as libc::c_int)?;
            check(libc::chdir(s.slash.as_ptr()))?;
            check(libc::umount2(
                self.old_root.as_ptr().add(old_root_relative),
                libc::MNT_DETACH,
            ))?;
            check(libc::rmdir(self.old_root.as_ptr().add(old_root_relative)))?;

            let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
            check(libc::mount(
                s.proc_.as_ptr(),
                s.proc_dir.as_ptr(),
                s.proc_.as_ptr(),
                nosuid_nodev | libc::MS_NOEXEC,
                nothing,
            ))?;
            check(libc::mount(
                s.sysfs.as_ptr(),
                s.sys_dir.as_ptr(),
                s.sysfs.as_ptr(),
                nosuid_nodev | libc::MS_NOEXEC | libc::MS_RDONLY,
                nothing,
            ))?;
            check(libc::mount(
                s.tmpfs.as_ptr(),
                s.dev_dir.as_ptr(),
                s.tmpfs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                s.dev_options.as_ptr().cast(),
            ))?;
            for d in &self.devices {
                check(libc::mknod(
                    d.path.as_ptr(),
                    libc::S_IFCHR | 0o666,
                    libc::makedev(d.major, d.minor),
                ))?;
                // mknod's mode passes through the umask: every user may use these devices.
                check(libc::chmod(d.path.as_ptr(), 0o666))?;
            }
            for dir in [&s.pts_dir, &s.shm_dir] {
                check(libc::mkdir(dir.as_ptr(), 0o755))?;
            }
            check(libc::mount(
                s.devpts.as_ptr(),
                s.pts_dir.as_ptr(),
                s.devpts.as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                s.pts_options.as_ptr().cast(),
            ))?;
            check(libc::mount(
                s.tmpfs.as_ptr(),
                s.shm_dir.as_ptr(),
                s.tmpfs.as_ptr(),
                nosuid_nodev,
                s.shm_options.as_ptr().cast(),
            ))?;
            for (link, to) in &self.dev_links {
                check(libc::symlink(to.as_ptr(), link.as_ptr()))?;
            }
            for (target, options) in &self.fresh_tmpfs {
                if target.make().is_ok() {
                    let _ = libc::mount(
                        s.tmpfs.as_ptr(),
                        target.path.as_ptr(),
                        s.tmpfs.as_ptr(),
                        nosuid_nodev,
                        options.as_ptr().cast(),
                    );
                }
            }
            // This machine's other file systems, then what stays private, then the volumes.
            for (clone, fd) in self.clones.iter().zip(self.clone_fds.iter()) {
                if clone.required {
                    continue;
                }
                if *fd >= 0 && clone.target.make().is_ok() {
                    let _ = move_mount(*fd, &s.empty, &clone.target.path);
                }
            }
            for target in &self.hidden {
                if target.file {
                    check(libc::mount(
                        s.null_device.as_ptr(),
                        target.path.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        nothing,
                    ))?;
                } else {
                    check(libc::mount(
                        s.tmpfs.as_ptr(),
                        target.path.as_ptr(),
                        s.tmpfs.as_ptr(),
                        nosuid_nodev | libc::MS_NOEXEC | libc::MS_RDONLY,
                        s.hidden_options.as_ptr().cast(),
                    ))?;
                }
            }
            for (clone, fd) in self.clones.iter().zip(self.clone_fds.iter()) {
                if !clone.required {
                    continue;
                }
                clone.target.make()?;
                move_mount(*fd, &s.empty, &clone.target.path)?;
            }
            for fd in &self.clone_fds {
                if *fd >= 0 {
                    libc::close(*fd);
                }
            }
            if let Some(dir) = &self.working_dir {
                dir.make()?;
            }
        }
        Ok(())
    }
}

/// Attaches the detached mount `tree` at `target`.
///
/// # Safety
/// A system call on prepared strings.
unsafe fn move_mount(tree: libc::c_int, empty: &CString, target: &CString) -> io::Result<()> {
    // SAFETY: the caller's strings are NUL-terminated and outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            empty.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(rc as libc::c_int)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_paths_stay_inside_the_container() {
        assert_eq!(in_container(Path::new("/var/lib/etcd")), PathBuf::from("/var/lib/etcd"));
        assert_eq!(in_container(Path::new("/../etc")), PathBuf::from("/etc"), "no way out");
        assert_eq!(
            prefixes(Path::new("/a/b")),
            vec![PathBuf::from("/a"), PathBuf::from("/a/b")]
        );
    }

    #[test]
    fn other_file_systems_are_listed_once_without_kernel_network_or_fuse_ones() {
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
53 27 0:41 / /run rw,nosuid - tmpfs tmpfs rw
54 27 0:42 / /mnt/nas rw - nfs4 server:/export rw
55 27 0:43 / /mnt/sshfs rw - fuse.sshfs host: rw
";
        assert_eq!(
            host_mounts(mountinfo),
            vec![
                HostMount {
                    point: PathBuf::from("/home"),
                    fresh_tmpfs: false
                },
                HostMount {
                    point: PathBuf::from("/mnt/with space"),
                    fresh_tmpfs: true
                },
                HostMount {
                    point: PathBuf::from("/run"),
                    fresh_tmpfs: true
                },
            ]
        );
    }

    #[test]
    fn a_layer_folder_overlayfs_cannot_name_is_refused() {
        assert!(usable_in_overlay_options(Path::new(
            "/var/lib/noops/pods/u/containers/app"
        )));
        assert!(!usable_in_overlay_options(Path::new("/data/a,b")));
        assert!(!usable_in_overlay_options(Path::new("/data/a:b")));
    }
}
