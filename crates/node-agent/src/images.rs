//! Image map: which local programs stand in for a container image.
//!
//! The local Kubernetes has no image store. Instead, a config file kept in the repository
//! (`cluster/images.yaml`) maps image patterns to folders of local executables plus the image's
//! default entrypoint, command, environment and user, as a Dockerfile would have set them.
//! Resolution follows Docker's rules: `command` replaces the entrypoint, `args` replaces the
//! default command.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Errors reading the image map or resolving an image through it.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("failed to read image map {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("failed to parse image map {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "image {image:?} is not mapped to a local program; add a pattern for it to {config} \
         (the local Kubernetes runs images as local programs)"
    )]
    NotMapped { image: String, config: String },
    /// The map says the registry has no such image (a tag never published).
    #[error("failed to pull image {image:?}: {message}")]
    PullFailed { image: String, message: String },
    #[error(
        "image {image:?} (mapped in {config}) has no command: set `command` in the pod or \
         `entrypoint` for the image"
    )]
    NoCommand { image: String, config: String },
    #[error("executable {program:?} of image {image:?} was not found in {searched}")]
    ProgramNotFound {
        image: String,
        program: String,
        searched: String,
    },
}

/// One entry of the image map.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageEntry {
    /// Glob patterns (`*` matches any run of characters) matched against the whole image reference.
    #[serde(rename = "match")]
    pub patterns: Vec<String>,
    /// Folders holding the image's programs; searched first for the command, and put first on PATH.
    #[serde(default)]
    pub path: Vec<String>,
    /// The image's ENTRYPOINT.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// The image's CMD.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// The image's ENV.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The user the image runs as by default (a numeric uid or a user name of this machine).
    #[serde(default)]
    pub user: Option<String>,
    /// The image's WORKDIR.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// Numeric ids of the image's own users, as this machine names them: a pod that runs the
    /// image as uid (or gid, or fsGroup) 999 means the image's `postgres`, which is this
    /// machine's `postgres` user (and its group) here.
    #[serde(default)]
    pub ids: BTreeMap<u32, String>,
    /// The registry has no such image (a tag that was never published): its containers wait
    /// with `ErrImagePull`, then `ImagePullBackOff`, and this message, as a real pull fails.
    #[serde(default)]
    pub pull_error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageMapFile {
    images: Vec<ImageEntry>,
}

/// The loaded image map, with `${VAR}` references already expanded.
#[derive(Debug, Clone)]
pub struct ImageMap {
    source: String,
    entries: Vec<ImageEntry>,
}

/// What to execute for one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedProgram {
    /// Absolute path of the executable.
    pub program: PathBuf,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// The image's environment (PATH included), before the container's own env is applied.
    pub env: BTreeMap<String, String>,
    /// The image's default user, if it sets one.
    pub user: Option<String>,
    /// The image's default working directory.
    pub working_dir: Option<String>,
    /// The image's numeric ids, as this machine names them.
    pub ids: BTreeMap<u32, String>,
}

/// The image map file, read again whenever it changes, so that an image reported as
/// `ImageNotMapped` starts once its pattern is added (the container is retried), without a
/// restart of the agent. A file that no longer parses leaves the last good map in use.
#[derive(Debug)]
pub struct ImageMapFileWatch {
    path: PathBuf,
    vars: BTreeMap<String, String>,
    loaded: std::sync::Mutex<(Option<FileStamp>, std::sync::Arc<ImageMap>)>,
}

/// What tells one version of the file from the next: its modification time and length (an edit
/// within one tick of the clock usually changes the length).
type FileStamp = (std::time::SystemTime, u64);

fn file_stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

impl ImageMapFileWatch {
    /// Loads the map from `path` (it must parse now).
    pub fn load(path: &Path, vars: BTreeMap<String, String>) -> Result<Self, ImageError> {
        let modified = file_stamp(path);
        let map = ImageMap::load(path, &vars)?;
        Ok(Self {
            path: path.to_path_buf(),
            vars,
            loaded: std::sync::Mutex::new((modified, std::sync::Arc::new(map))),
        })
    }

    /// The map as the file says now.
    pub fn current(&self) -> std::sync::Arc<ImageMap> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let modified = file_stamp(&self.path);
        if modified.is_some() && modified != loaded.0 {
            match ImageMap::load(&self.path, &self.vars) {
                Ok(map) => {
                    tracing::info!(path = %self.path.display(), "image map changed; reloaded it");
                    *loaded = (modified, std::sync::Arc::new(map));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "image map changed but cannot be read; keeping the previous one");
                    loaded.0 = modified;
                }
            }
        }
        loaded.1.clone()
    }
}

/// The PATH of a container whose image sets none of its own.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl ImageMap {
    /// Reads the map from `path`, expanding `${VAR}` from `vars`.
    pub fn load(path: &Path, vars: &BTreeMap<String, String>) -> Result<Self, ImageError> {
        let text = std::fs::read_to_string(path).map_err(|source| ImageError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string(), vars)
    }

    /// Parses the map from YAML text; `source` names it in error messages.
    pub fn parse(text: &str, source: &str, vars: &BTreeMap<String, String>) -> Result<Self, ImageError> {
        let file: ImageMapFile = serde_saphyr::from_str(text).map_err(|e| ImageError::Parse {
            path: PathBuf::from(source),
            message: e.to_string(),
        })?;
        let expand_all = |items: &[String]| items.iter().map(|s| expand(s, vars)).collect();
        let entries = file
            .images
            .into_iter()
            .map(|e| ImageEntry {
                path: expand_all(&e.path),
                entrypoint: expand_all(&e.entrypoint),
                cmd: expand_all(&e.cmd),
                env: e.env.iter().map(|(k, v)| (k.clone(), expand(v, vars))).collect(),
                ..e
            })
            .collect();
        Ok(Self {
            source: source.to_string(),
            entries,
        })
    }

    /// The first entry whose pattern matches `image`.
    pub fn lookup(&self, image: &str) -> Result<&ImageEntry, ImageError> {
        self.entries
            .iter()
            .find(|e| e.patterns.iter().any(|p| glob_match(p, image)))
            .ok_or_else(|| ImageError::NotMapped {
                image: image.to_string(),
                config: self.source.clone(),
            })
    }

    /// Resolves a container's image, command and args to a local program.
    ///
    /// `exists` says whether a path is an executable file; it is a parameter so that the
    /// resolution rules can be tested without touching the file system.
    pub fn resolve(
        &self,
        image: &str,
        command: &[String],
        args: &[String],
        exists: &dyn Fn(&Path) -> bool,
    ) -> Result<ResolvedProgram, ImageError> {
        let entry = self.lookup(image)?;
        if let Some(message) = &entry.pull_error {
            return Err(ImageError::PullFailed {
                image: image.to_string(),
                message: message.clone(),
            });
        }
        let mut argv: Vec<String> = if command.is_empty() {
            let defaults = if args.is_empty() { &entry.cmd } else { &args.to_vec() };
            entry.entrypoint.iter().chain(defaults.iter()).cloned().collect()
        } else {
            command.iter().chain(args.iter()).cloned().collect()
        };
        if argv.is_empty() {
            return Err(ImageError::NoCommand {
                image: image.to_string(),
                config: self.source.clone(),
            });
        }
        let first = argv.remove(0);
        let image_path = entry.path.join(":");
        let search_path = if image_path.is_empty() {
            DEFAULT_PATH.to_string()
        } else {
            format!("{image_path}:{DEFAULT_PATH}")
        };
        let program =
            find_program(&first, &entry.path, &search_path, exists).ok_or_else(|| ImageError::ProgramNotFound {
                image: image.to_string(),
                program: first.clone(),
                searched: search_path.clone(),
            })?;
        let mut env = entry.env.clone();
        env.entry("PATH".to_string()).or_insert(search_path);
        Ok(ResolvedProgram {
            program,
            args: argv,
            env,
            user: entry.user.clone(),
            working_dir: entry.working_dir.clone(),
            ids: entry.ids.clone(),
        })
    }
}

/// Finds the executable for `name`: an absolute path names a file inside the image, so its base
/// name is looked up in the image's folders first, then the path is tried as it is on this
/// machine; a bare name is searched on the container's PATH.
fn find_program(
    name: &str,
    image_dirs: &[String],
    search_path: &str,
    exists: &dyn Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if name.contains('/') {
        let base = Path::new(name).file_name()?;
        let in_image = image_dirs.iter().map(|d| Path::new(d).join(base)).find(|p| exists(p));
        return in_image.or_else(|| {
            let p = PathBuf::from(name);
            (p.is_absolute() && exists(&p)).then_some(p)
        });
    }
    search_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| exists(p))
}

/// Expands `${VAR}` from `vars`; unknown variables are left as they are so the error is visible.
fn expand(text: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find('}') {
            Some(end) => {
                let name = &after[..end];
                match vars.get(name) {
                    Some(v) => out.push_str(v),
                    None => out.push_str(&rest[start..start + 3 + end]),
                }
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Matches `text` against a glob where `*` matches any run of characters (including none).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            backtrack = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star, matched)) = backtrack {
            pi = star + 1;
            ti = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod watch_tests {
    use super::*;

    #[test]
    fn an_edited_map_is_used_and_a_broken_edit_keeps_the_last_good_one() {
        let dir = std::env::temp_dir().join(format!("noops-images-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("images.yaml");
        std::fs::write(&file, "images:\n  - match: [\"a:*\"]\n    cmd: [sh]\n").unwrap();
        let watch = ImageMapFileWatch::load(&file, BTreeMap::new()).unwrap();
        assert!(watch.current().lookup("a:1").is_ok());
        assert!(watch.current().lookup("b:1").is_err());
        // Each edit gets a later modification time, as a real edit a moment later would.
        let edit = |text: &str, secs: u64| {
            std::fs::write(&file, text).unwrap();
            let at = std::time::SystemTime::now() + std::time::Duration::from_secs(secs);
            std::fs::File::options()
                .write(true)
                .open(&file)
                .unwrap()
                .set_modified(at)
                .unwrap();
        };
        edit("images:\n  - match: [\"b:*\"]\n    cmd: [sh]\n", 5);
        assert!(watch.current().lookup("b:1").is_ok(), "the edit is seen");
        edit("images: [not: valid", 10);
        assert!(watch.current().lookup("b:1").is_ok(), "the last good map stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = r#"
images:
  - match: ["quay.io/coreos/etcd:v3.5.*", "*/etcd:3.5*"]
    path: ["${BIN}/etcd-3.5"]
    entrypoint: ["/usr/local/bin/etcd"]
  - match: ["busybox*"]
    cmd: ["sh"]
  - match: ["hashicorp/http-echo*"]
    path: ["${BIN}/testbins"]
    entrypoint: ["/http-echo"]
    env: { GREETING: "${BIN}/x" }
    user: "65534"
"#;

    fn map() -> ImageMap {
        let vars = BTreeMap::from([("BIN".to_string(), "/opt/bin".to_string())]);
        ImageMap::parse(MAP, "cluster/images.yaml", &vars).unwrap()
    }

    fn on_disk(files: &'static [&'static str]) -> impl Fn(&Path) -> bool {
        move |p: &Path| files.iter().any(|f| Path::new(f) == p)
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_image_the_registry_does_not_have_fails_to_pull_with_the_maps_message() {
        let map = ImageMap::parse(
            "images:\n  - match: [\"*etcd:v3.6.99*\"]\n    pullError: manifest unknown\n  - match: [\"*etcd:v3.6.*\"]\n    path: [/bin]\n    entrypoint: [etcd]\n",
            "images.yaml",
            &BTreeMap::new(),
        )
        .unwrap();
        let always = |_: &Path| true;
        let err = map
            .resolve("quay.io/coreos/etcd:v3.6.99", &[], &[], &always)
            .unwrap_err();
        assert!(
            matches!(&err, ImageError::PullFailed { message, .. } if message == "manifest unknown"),
            "{err}"
        );
        assert!(map.resolve("quay.io/coreos/etcd:v3.6.4", &[], &[], &always).is_ok());
    }

    #[test]
    fn glob_matches_stars_anywhere() {
        assert!(glob_match("quay.io/coreos/etcd:v3.5.*", "quay.io/coreos/etcd:v3.5.17"));
        assert!(!glob_match("quay.io/coreos/etcd:v3.5.*", "quay.io/coreos/etcd:v3.6.0"));
        assert!(glob_match("*/etcd:3.5*", "registry.k8s.io/etcd:3.5.21-0"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("abc", "abcd"));
    }

    #[test]
    fn entrypoint_from_image_with_args_from_pod() {
        let exists = on_disk(&["/opt/bin/etcd-3.5/etcd"]);
        let r = map()
            .resolve("quay.io/coreos/etcd:v3.5.21", &[], &strings(&["--name", "a"]), &exists)
            .unwrap();
        assert_eq!(r.program, PathBuf::from("/opt/bin/etcd-3.5/etcd"));
        assert_eq!(r.args, strings(&["--name", "a"]));
        assert!(r.env["PATH"].starts_with("/opt/bin/etcd-3.5:"));
    }

    #[test]
    fn pod_command_replaces_entrypoint_and_bare_names_search_the_image_first() {
        let exists = on_disk(&["/opt/bin/etcd-3.5/etcdctl", "/usr/bin/etcdctl"]);
        let r = map()
            .resolve(
                "quay.io/coreos/etcd:v3.5.0",
                &strings(&["etcdctl", "get"]),
                &[],
                &exists,
            )
            .unwrap();
        assert_eq!(r.program, PathBuf::from("/opt/bin/etcd-3.5/etcdctl"));
        assert_eq!(r.args, strings(&["get"]));
    }

    #[test]
    fn absolute_commands_fall_back_to_this_machine() {
        let exists = on_disk(&["/bin/sh"]);
        let r = map()
            .resolve("busybox:1.36", &strings(&["/bin/sh", "-c", "echo hi"]), &[], &exists)
            .unwrap();
        assert_eq!(r.program, PathBuf::from("/bin/sh"));
        assert_eq!(r.env["PATH"], DEFAULT_PATH);
    }

    #[test]
    fn default_cmd_is_used_when_pod_gives_nothing() {
        let exists = on_disk(&["/bin/sh"]);
        let r = map().resolve("busybox", &[], &[], &exists).unwrap();
        assert_eq!(r.program, PathBuf::from("/bin/sh"));
        assert!(r.args.is_empty());
    }

    #[test]
    fn variables_expand_in_env_and_user_is_kept() {
        let exists = on_disk(&["/opt/bin/testbins/http-echo"]);
        let r = map().resolve("hashicorp/http-echo:1.0", &[], &[], &exists).unwrap();
        assert_eq!(r.env["GREETING"], "/opt/bin/x");
        assert_eq!(r.user.as_deref(), Some("65534"));
    }

    #[test]
    fn unknown_image_names_the_config_file() {
        let err = map().resolve("nginx:1.27", &[], &[], &|_| true).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("nginx:1.27") && text.contains("cluster/images.yaml"),
            "{text}"
        );
    }

    #[test]
    fn missing_program_is_reported_with_the_search_path() {
        let err = map()
            .resolve("quay.io/coreos/etcd:v3.5.1", &[], &[], &|_| false)
            .unwrap_err();
        assert!(matches!(err, ImageError::ProgramNotFound { .. }), "{err}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let bad = "images:\n  - match: [x]\n    entrypiont: [y]\n";
        assert!(ImageMap::parse(bad, "f", &BTreeMap::new()).is_err());
    }

    #[test]
    fn unknown_variables_stay_visible() {
        assert_eq!(expand("${NOPE}/x", &BTreeMap::new()), "${NOPE}/x");
        assert_eq!(expand("a${B", &BTreeMap::new()), "a${B");
    }
}
