//! Turning a container of a pod spec into a process to start: program, arguments, environment,
//! user, mounts. Pure functions over data the worker has already gathered, so they are tested
//! without a cluster.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::env::expand;
use crate::images::ResolvedProgram;
use crate::rootfs::BindMount;

/// A container that cannot be started as specified (CreateContainerConfigError).
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct LaunchError(pub String);

/// Facts about the pod's sandbox that every container of it shares.
#[derive(Debug, Clone)]
pub struct PodSandbox {
    pub hostname: String,
    pub pod_ip: Ipv4Addr,
    pub host_network: bool,
    /// Host folder of each volume.
    pub volumes: BTreeMap<String, PathBuf>,
    /// Generated `/etc/hosts` and `/etc/resolv.conf` of the pod.
    pub hosts_file: PathBuf,
    pub resolv_file: PathBuf,
    /// The `kubernetes` Service address, for in-cluster clients.
    pub api_service: (Ipv4Addr, u16),
}

/// The user and groups a container runs as.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Identity {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
}

/// Works out the container's user: the container's securityContext, then the pod's, then the
/// image's default. fsGroup and supplementalGroups become extra groups. `lookup_user` maps a
/// user name to (uid, gid) on this machine.
pub fn identity(
    pod: &Pod,
    container: &Container,
    image_user: Option<&str>,
    lookup_user: &dyn Fn(&str) -> Option<(u32, u32)>,
) -> Result<Identity, LaunchError> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let image = match image_user {
        None => None,
        Some(u) => match u.parse::<u32>() {
            Ok(uid) => Some((uid, None)),
            Err(_) => {
                let (uid, gid) = lookup_user(u)
                    .ok_or_else(|| LaunchError(format!("image user {u:?} does not exist on this machine")))?;
                Some((uid, Some(gid)))
            }
        },
    };
    let as_u32 = |v: i64, what: &str| u32::try_from(v).map_err(|_| LaunchError(format!("invalid {what} {v}")));
    let uid = match sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user)) {
        Some(u) => Some(as_u32(u, "runAsUser")?),
        None => image.map(|(u, _)| u),
    };
    let gid = match sc.and_then(|s| s.run_as_group).or(pod_sc.and_then(|s| s.run_as_group)) {
        Some(g) => Some(as_u32(g, "runAsGroup")?),
        None => image.and_then(|(_, g)| g).or(uid.map(|_| 0)),
    };
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(pod_sc.and_then(|s| s.run_as_non_root));
    if non_root == Some(true) && uid.unwrap_or(0) == 0 {
        return Err(LaunchError(
            "container has runAsNonRoot and its image will run as root: set runAsUser".into(),
        ));
    }
    let mut groups = vec![];
    if let Some(fs_group) = pod_sc.and_then(|s| s.fs_group) {
        groups.push(as_u32(fs_group, "fsGroup")?);
    }
    for g in pod_sc.and_then(|s| s.supplemental_groups.clone()).unwrap_or_default() {
        groups.push(as_u32(g, "supplementalGroups")?);
    }
    if let Some(g) = gid {
        groups.retain(|x| *x != g);
    }
    Ok(Identity { uid, gid, groups })
}

/// Where `path`, as the container will see it, is on this machine: inside the bind mount
/// whose target holds it (the deepest one), or the path itself (the root file system shows
/// this machine's files).
pub fn through_mounts(path: &Path, mounts: &[BindMount]) -> PathBuf {
    mounts
        .iter()
        .filter_map(|m| Some((m, path.strip_prefix(&m.target).ok()?)))
        .max_by_key(|(m, _)| m.target.components().count())
        .map(|(m, rest)| {
            if rest.as_os_str().is_empty() {
                m.source.clone()
            } else {
                m.source.join(rest)
            }
        })
        .unwrap_or_else(|| path.to_path_buf())
}

/// Translates the image's own numeric ids (`ids`: uid or gid → a user name of this machine)
/// into this machine's: a pod that asks for uid 999 of the official postgres image gets this
/// machine's `postgres`, and gid 999 that user's group.
pub fn image_ids(
    identity: Identity,
    ids: &std::collections::BTreeMap<u32, String>,
    lookup_user: &dyn Fn(&str) -> Option<(u32, u32)>,
) -> Result<Identity, LaunchError> {
    let local = |id: u32| -> Result<Option<(u32, u32)>, LaunchError> {
        match ids.get(&id) {
            None => Ok(None),
            Some(name) => lookup_user(name)
                .map(Some)
                .ok_or_else(|| LaunchError(format!("image user {name:?} (id {id}) does not exist on this machine"))),
        }
    };
    let uid = match identity.uid {
        Some(u) => Some(local(u)?.map_or(u, |(uid, _)| uid)),
        None => None,
    };
    let gid = match identity.gid {
        Some(g) => Some(local(g)?.map_or(g, |(_, gid)| gid)),
        None => None,
    };
    // Supplementary groups (fsGroup among them) stay as they are: volume files are chowned to
    // the number the pod gives, and the process must hold that same number to read them. A
    // primary group that was translated stays among them for the same reason.
    let mut groups = identity.groups;
    if let Some(asked) = identity.gid
        && gid != Some(asked)
        && !groups.contains(&asked)
    {
        groups.insert(0, asked);
    }
    Ok(Identity { uid, gid, groups })
}

/// Linux capabilities by number (`capability.h`), without the `CAP_` prefix.
const CAPABILITY_NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// What a container runtime grants by default (containerd's and Docker's set), except MKNOD:
/// without a device cgroup, a device node made in a container would reach this machine's disks.
const DEFAULT_CAPABILITIES: [&str; 13] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

fn capability_number(name: &str) -> Result<u32, LaunchError> {
    let bare = name.strip_prefix("CAP_").unwrap_or(name).to_ascii_uppercase();
    CAPABILITY_NAMES
        .iter()
        .position(|n| *n == bare)
        .map(|i| i as u32)
        .ok_or_else(|| LaunchError(format!("unknown capability {name:?} in securityContext.capabilities")))
}

/// The capabilities a container may have: the default set, plus `securityContext.capabilities.
/// add`, minus `drop` (`ALL` drops every one); `None` (all of them) for a privileged container.
pub fn capabilities(container: &Container) -> Result<Option<Vec<u32>>, LaunchError> {
    let sc = container.security_context.as_ref();
    if sc.and_then(|s| s.privileged) == Some(true) {
        return Ok(None);
    }
    let requested = sc.and_then(|s| s.capabilities.as_ref());
    let add: Vec<String> = requested.and_then(|c| c.add.clone()).unwrap_or_default();
    let drop: Vec<String> = requested.and_then(|c| c.drop.clone()).unwrap_or_default();
    let mut kept: Vec<u32> = vec![];
    if !drop.iter().any(|d| d.eq_ignore_ascii_case("ALL")) {
        for name in DEFAULT_CAPABILITIES {
            kept.push(capability_number(name)?);
        }
    }
    for name in &drop {
        if !name.eq_ignore_ascii_case("ALL") {
            let number = capability_number(name)?;
            kept.retain(|c| *c != number);
        }
    }
    for name in &add {
        if name.eq_ignore_ascii_case("ALL") {
            return Ok(None);
        }
        let number = capability_number(name)?;
        if !kept.contains(&number) {
            kept.push(number);
        }
    }
    kept.sort_unstable();
    Ok(Some(kept))
}

/// The bind mounts of one container: its volumeMounts, plus the pod's hosts and resolv.conf.
pub fn mounts(container: &Container, sandbox: &PodSandbox) -> Result<Vec<BindMount>, LaunchError> {
    let mut out = vec![];
    for m in container.volume_mounts.iter().flatten() {
        let source = sandbox
            .volumes
            .get(&m.name)
            .ok_or_else(|| LaunchError(format!("volumeMount {:?} refers to no volume of the pod", m.name)))?;
        let mut source = source.clone();
        let sub = m.sub_path.as_deref().unwrap_or("");
        if !sub.is_empty() {
            if !Path::new(sub).components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(LaunchError(format!(
                    "subPath {sub:?} must be a relative path inside the volume"
                )));
            }
            source = source.join(sub);
        }
        if !m.mount_path.starts_with('/') {
            return Err(LaunchError(format!("mountPath {:?} must be absolute", m.mount_path)));
        }
        out.push(BindMount {
            source,
            target: PathBuf::from(&m.mount_path),
            read_only: m.read_only.unwrap_or(false),
        });
    }
    if !sandbox.host_network {
        for (file, target) in [
            (&sandbox.hosts_file, "/etc/hosts"),
            (&sandbox.resolv_file, "/etc/resolv.conf"),
        ] {
            if !out.iter().any(|m| m.target == Path::new(target)) {
                out.push(BindMount {
                    source: file.clone(),
                    target: target.into(),
                    read_only: false,
                });
            }
        }
    }
    Ok(out)
}

/// Where a container's termination message goes, as the kubelet does it.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// The most of a termination message that is kept (the kubelet's limit).
const MESSAGE_LIMIT: usize = 4096;
/// The most of the log that `FallbackToLogsOnError` takes.
const LOG_FALLBACK_LIMIT: usize = 2048;
const LOG_FALLBACK_LINES: usize = 80;

/// The bind mount of `host_file` at the container's `terminationMessagePath`, unless one of
/// its own volumes is mounted there.
pub fn termination_mount(container: &Container, host_file: &Path, mounts: &[BindMount]) -> Option<BindMount> {
    let path = container
        .termination_message_path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_TERMINATION_MESSAGE_PATH);
    let target = PathBuf::from(path);
    (target.is_absolute() && !mounts.iter().any(|m| m.target == target)).then(|| BindMount {
        source: host_file.to_path_buf(),
        target,
        read_only: false,
    })
}

/// The termination message of a container that exited with `exit_code`: what it wrote to its
/// termination file, else (with `FallbackToLogsOnError`, after a failure) the end of its log.
pub fn termination_message(container: &Container, written: &[u8], exit_code: i32, log: &[u8]) -> Option<String> {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let written = &written[..written.len().min(MESSAGE_LIMIT)];
    if !written.is_empty() {
        return Some(text(written));
    }
    let fallback = container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
    if !fallback || exit_code == 0 || log.is_empty() {
        return None;
    }
    let log = log.strip_suffix(b"\n").unwrap_or(log);
    let start = log
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(LOG_FALLBACK_LINES - 1)
        .map_or(0, |(i, _)| i + 1)
        .max(log.len().saturating_sub(LOG_FALLBACK_LIMIT));
    Some(text(&log[start..]))
}

/// The full environment: image defaults, then the variables every container gets, then the
/// container's own (which win).
pub fn environment(
    program: &ResolvedProgram,
    sandbox: &PodSandbox,
    identity: &Identity,
    container_env: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = program.env.clone();
    let (api_ip, api_port) = sandbox.api_service;
    env.insert("HOSTNAME".into(), sandbox.hostname.clone());
    env.insert("KUBERNETES_SERVICE_HOST".into(), api_ip.to_string());
    env.insert("KUBERNETES_SERVICE_PORT".into(), api_port.to_string());
    env.insert("KUBERNETES_SERVICE_PORT_HTTPS".into(), api_port.to_string());
    env.insert("KUBERNETES_PORT".into(), format!("tcp://{api_ip}:{api_port}"));
    env.insert(
        format!("KUBERNETES_PORT_{api_port}_TCP"),
        format!("tcp://{api_ip}:{api_port}"),
    );
    env.insert(format!("KUBERNETES_PORT_{api_port}_TCP_PROTO"), "tcp".into());
    env.insert(format!("KUBERNETES_PORT_{api_port}_TCP_PORT"), api_port.to_string());
    env.insert(format!("KUBERNETES_PORT_{api_port}_TCP_ADDR"), api_ip.to_string());
    if !env.contains_key("HOME") {
        let home = if identity.uid.unwrap_or(0) == 0 { "/root" } else { "/" };
        env.insert("HOME".into(), home.into());
    }
    for (k, v) in container_env {
        env.insert(k.clone(), v.clone());
    }
    env.into_iter().collect()
}

/// Expands `$(VAR)` in command and args with the container's environment, as the kubelet does.
pub fn expand_args(args: &[String], env: &[(String, String)]) -> Vec<String> {
    let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    args.iter().map(|a| expand(a, &lookup)).collect()
}

/// The container's command and args after `$(VAR)` expansion (before image resolution).
pub fn command_and_args(container: &Container, env: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    (
        expand_args(&container.command.clone().unwrap_or_default(), env),
        expand_args(&container.args.clone().unwrap_or_default(), env),
    )
}

/// The pod's hostname: `spec.hostname` or the pod name, at most 63 characters.
pub fn hostname(pod: &Pod) -> String {
    let name = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .or(pod.metadata.name.clone())
        .unwrap_or_default();
    name.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches(['-', '.'])
        .to_string()
}

/// The pod's `/etc/hosts`.
pub fn hosts_file(pod: &Pod, pod_ip: Ipv4Addr, cluster_domain: &str) -> String {
    let host = hostname(pod);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = String::from("# Kubernetes-managed hosts file (noops node agent).\n127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    match pod.spec.as_ref().and_then(|s| s.subdomain.as_deref()) {
        Some(sub) if !sub.is_empty() => out.push_str(&format!(
            "{pod_ip}\t{host}.{sub}.{namespace}.svc.{cluster_domain}\t{host}\n"
        )),
        _ => out.push_str(&format!("{pod_ip}\t{host}\n")),
    }
    for alias in pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.clone())
        .unwrap_or_default()
    {
        let names = alias.hostnames.unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{names}\n", alias.ip));
    }
    out
}

/// The pod's `/etc/resolv.conf`: the node's DNS server, with the cluster search path.
pub fn resolv_conf(pod: &Pod, nameserver: Ipv4Addr, cluster_domain: &str) -> String {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let mut nameservers = vec![nameserver.to_string()];
    let mut searches = vec![
        format!("{namespace}.svc.{cluster_domain}"),
        format!("svc.{cluster_domain}"),
        cluster_domain.to_string(),
    ];
    let mut options = vec!["ndots:5".to_string()];
    if policy == "None" {
        nameservers.clear();
        searches.clear();
        options.clear();
    }
    if let Some(cfg) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        nameservers.extend(cfg.nameservers.clone().unwrap_or_default());
        searches.extend(cfg.searches.clone().unwrap_or_default());
        for o in cfg.options.clone().unwrap_or_default() {
            options.push(match o.value {
                Some(v) => format!("{}:{v}", o.name.unwrap_or_default()),
                None => o.name.unwrap_or_default(),
            });
        }
    }
    let mut out = String::new();
    for ns in nameservers {
        out.push_str(&format!("nameserver {ns}\n"));
    }
    if !searches.is_empty() {
        out.push_str(&format!("search {}\n", searches.join(" ")));
    }
    if !options.is_empty() {
        out.push_str(&format!("options {}\n", options.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, SecurityContext, VolumeMount};

    fn pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("etcd-0".into());
        p.metadata.namespace = Some("db".into());
        p.spec = Some(PodSpec {
            subdomain: Some("etcd".into()),
            ..Default::default()
        });
        p
    }

    fn sandbox() -> PodSandbox {
        PodSandbox {
            hostname: "etcd-0".into(),
            pod_ip: Ipv4Addr::new(10, 244, 0, 3),
            host_network: false,
            volumes: BTreeMap::from([("data".into(), PathBuf::from("/vol/data"))]),
            hosts_file: "/pod/hosts".into(),
            resolv_file: "/pod/resolv.conf".into(),
            api_service: (Ipv4Addr::new(10, 96, 0, 1), 443),
        }
    }

    #[test]
    fn hosts_and_resolv() {
        let p = pod();
        let hosts = hosts_file(&p, Ipv4Addr::new(10, 244, 0, 3), "cluster.local");
        assert!(
            hosts.contains("10.244.0.3\tetcd-0.etcd.db.svc.cluster.local\tetcd-0\n"),
            "{hosts}"
        );
        let resolv = resolv_conf(&p, Ipv4Addr::new(10, 244, 0, 1), "cluster.local");
        assert_eq!(
            resolv,
            "nameserver 10.244.0.1\nsearch db.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
        );
    }

    #[test]
    fn mounts_include_volumes_and_pod_files() {
        let c = Container {
            volume_mounts: Some(vec![VolumeMount {
                name: "data".into(),
                mount_path: "/var/lib/etcd".into(),
                sub_path: Some("member".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let m = mounts(&c, &sandbox()).unwrap();
        assert_eq!(m[0].source, PathBuf::from("/vol/data/member"));
        assert_eq!(m[0].target, PathBuf::from("/var/lib/etcd"));
        assert!(m.iter().any(|m| m.target == Path::new("/etc/resolv.conf")));
        let bad = Container {
            volume_mounts: Some(vec![VolumeMount {
                name: "data".into(),
                mount_path: "/x".into(),
                sub_path: Some("../../etc".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(mounts(&bad, &sandbox()).is_err());
        let unknown = Container {
            volume_mounts: Some(vec![VolumeMount {
                name: "nope".into(),
                mount_path: "/x".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(mounts(&unknown, &sandbox()).is_err());
    }

    #[test]
    fn the_termination_message_is_what_the_container_wrote_or_its_last_log_lines() {
        let mut c = Container::default();
        let file = Path::new("/pods/x/termination/c");
        let mount = termination_mount(&c, file, &[]).unwrap();
        assert_eq!(mount.target, Path::new("/dev/termination-log"));
        c.termination_message_path = Some("/tmp/done".into());
        assert_eq!(termination_mount(&c, file, &[]).unwrap().target, Path::new("/tmp/done"));
        let taken = BindMount {
            source: "/v".into(),
            target: "/tmp/done".into(),
            read_only: false,
        };
        assert!(
            termination_mount(&c, file, &[taken]).is_none(),
            "a volume mounted there wins"
        );

        assert_eq!(termination_message(&c, b"saved", 0, b"log").as_deref(), Some("saved"));
        assert_eq!(termination_message(&c, &[b'x'; 5000], 1, b"").unwrap().len(), 4096);
        assert_eq!(termination_message(&c, b"", 1, b"log"), None, "logs only when asked");
        c.termination_message_policy = Some("FallbackToLogsOnError".into());
        assert_eq!(termination_message(&c, b"", 0, b"log"), None, "not after a success");
        let log: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let message = termination_message(&c, b"", 1, log.as_bytes()).unwrap();
        assert!(
            message.starts_with("line 20\n") && message.ends_with("line 99"),
            "{message}"
        );
    }

    #[test]
    fn identity_precedence() {
        let mut p = pod();
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            ..Default::default()
        });
        let c = Container::default();
        let none = |_: &str| None;
        let id = identity(&p, &c, Some("999"), &none).unwrap();
        assert_eq!(
            id,
            Identity {
                uid: Some(1000),
                gid: Some(0),
                groups: vec![2000]
            }
        );
        let c2 = Container {
            security_context: Some(SecurityContext {
                run_as_user: Some(7),
                run_as_group: Some(8),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(identity(&p, &c2, None, &none).unwrap().uid, Some(7));
        let postgres = |n: &str| (n == "postgres").then_some((105, 110));
        let plain = pod();
        assert_eq!(
            identity(&plain, &c, Some("postgres"), &postgres).unwrap(),
            Identity {
                uid: Some(105),
                gid: Some(110),
                groups: vec![]
            }
        );
        assert!(identity(&plain, &c, Some("nobody-here"), &none).is_err());
        let strict = Container {
            security_context: Some(SecurityContext {
                run_as_non_root: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(identity(&plain, &strict, None, &none).is_err());
    }

    #[test]
    fn a_path_in_a_volume_is_found_in_the_volume() {
        let mounts = vec![
            BindMount {
                source: "/pods/p1/volumes/controller".into(),
                target: "/controller".into(),
                read_only: false,
            },
            BindMount {
                source: "/pods/p1/volumes/run".into(),
                target: "/controller/run".into(),
                read_only: false,
            },
        ];
        let through = |p: &str| through_mounts(Path::new(p), &mounts);
        assert_eq!(
            through("/controller/noops"),
            PathBuf::from("/pods/p1/volumes/controller/noops")
        );
        assert_eq!(
            through("/controller/run/x"),
            PathBuf::from("/pods/p1/volumes/run/x"),
            "the deepest mount"
        );
        assert_eq!(through("/controller"), PathBuf::from("/pods/p1/volumes/controller"));
        assert_eq!(
            through("/controllers/x"),
            PathBuf::from("/controllers/x"),
            "whole components only"
        );
        assert_eq!(through("/usr/bin/env"), PathBuf::from("/usr/bin/env"));
    }

    #[test]
    fn the_images_own_ids_become_this_machines() {
        let postgres = |n: &str| (n == "postgres").then_some((105, 110));
        let ids = std::collections::BTreeMap::from([(999, "postgres".to_string())]);
        // As `identity` gives it for runAsGroup 999 and fsGroup 999: the fsGroup is the primary
        // group, so not among the others.
        let asked = Identity {
            uid: Some(999),
            gid: Some(999),
            groups: vec![5],
        };
        let local = image_ids(asked, &ids, &postgres).unwrap();
        assert_eq!(
            local,
            Identity {
                uid: Some(105),
                gid: Some(110),
                groups: vec![999, 5]
            },
            "fsGroup 999 stays: the volume's files are chowned to it"
        );
        let other = Identity {
            uid: Some(7),
            gid: None,
            groups: vec![],
        };
        assert_eq!(image_ids(other.clone(), &ids, &postgres).unwrap(), other);
        let missing = std::collections::BTreeMap::from([(999, "nobody-here".to_string())]);
        let asked = Identity {
            uid: Some(999),
            ..Default::default()
        };
        assert!(image_ids(asked, &missing, &postgres).is_err());
    }

    #[test]
    fn capabilities_start_from_the_runtime_default_without_mknod() {
        use k8s_openapi::api::core::v1::Capabilities;
        let number = |n: &str| capability_number(n).unwrap();
        let default = capabilities(&Container::default()).unwrap().unwrap();
        assert_eq!(default.len(), DEFAULT_CAPABILITIES.len());
        assert!(default.contains(&number("NET_BIND_SERVICE")));
        for absent in ["SYS_ADMIN", "MKNOD", "SYS_PTRACE", "SYS_MODULE", "NET_ADMIN"] {
            assert!(!default.contains(&number(absent)), "{absent}");
        }
        let with = |add: &[&str], drop: &[&str]| Container {
            security_context: Some(SecurityContext {
                capabilities: Some(Capabilities {
                    add: Some(add.iter().map(|s| s.to_string()).collect()),
                    drop: Some(drop.iter().map(|s| s.to_string()).collect()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let changed = capabilities(&with(&["NET_ADMIN"], &["CAP_KILL"])).unwrap().unwrap();
        assert!(changed.contains(&number("NET_ADMIN")) && !changed.contains(&number("KILL")));
        assert_eq!(
            capabilities(&with(&["NET_BIND_SERVICE"], &["ALL"])).unwrap().unwrap(),
            vec![number("NET_BIND_SERVICE")]
        );
        assert!(capabilities(&with(&["NOT_A_CAP"], &[])).is_err());
        let privileged = Container {
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(capabilities(&privileged).unwrap(), None);
    }

    #[test]
    fn env_order_and_expansion() {
        let program = ResolvedProgram {
            program: "/bin/x".into(),
            args: vec![],
            env: BTreeMap::from([("PATH".into(), "/img:/bin".into()), ("MODE".into(), "image".into())]),
            user: None,
            working_dir: None,
            ids: BTreeMap::new(),
        };
        let env = environment(
            &program,
            &sandbox(),
            &Identity::default(),
            &[("MODE".into(), "pod".into())],
        );
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("MODE"), Some("pod"));
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("HOSTNAME"), Some("etcd-0"));
        assert_eq!(
            expand_args(&["--name=$(HOSTNAME)".into()], &env),
            vec!["--name=etcd-0".to_string()]
        );
    }
}
