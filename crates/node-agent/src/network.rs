//! Pod networking: one network namespace per pod, joined to the cluster's bridge by a veth pair.
//!
//! Every node of the local Kubernetes shares one bridge: the node's pods get addresses from the
//! node's own pod CIDR (a /24), with the whole cluster network (the /16) on their link so that
//! pods of other nodes are reached directly, and the node's address as their gateway (to
//! Services and to this machine). The bridge, its routes and the safety rules that keep every
//! packet on this machine are set up by `hack/cluster-up.sh` before the agent starts; the agent
//! refuses to run without them. A node agent that is a whole machine (`machine.rs`) makes a
//! bridge of its own instead: only its range is on its pods' link, and the gateway routes the
//! rest. Addresses come from a tiny file-based allocator, keyed by pod
//! UID, so a pod keeps its IP when the agent restarts.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// Errors setting up or tearing down pod networks.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("bridge {0} does not exist: run `make cluster-up`, which creates it")]
    NoBridge(String),
    #[error("no free address left in pod network {0}")]
    Exhausted(String),
    #[error("failed to run `ip {args}`: {message}")]
    Ip { args: String, message: String },
    #[error("address bookkeeping in {path} failed: {source}")]
    Ipam { path: PathBuf, source: std::io::Error },
}

/// An IPv4 network (address and prefix length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl std::str::FromStr for Ipv4Net {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, p) = s.split_once('/').ok_or_else(|| format!("{s:?} is not a CIDR"))?;
        let addr: Ipv4Addr = a.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let prefix: u8 = p.parse().map_err(|e| format!("{s:?}: {e}"))?;
        if !(8..=30).contains(&prefix) {
            return Err(format!("{s:?}: prefix must be between /8 and /30"));
        }
        Ok(Self { addr, prefix })
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network(), self.prefix)
    }
}

impl Ipv4Net {
    fn mask(&self) -> u32 {
        u32::MAX << (32 - self.prefix)
    }
    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) & self.mask())
    }
    /// The first host address (a node's own, the gateway of its pods).
    pub fn first_host(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network()) + 1)
    }
    /// Whether `ip` lies inside this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.network())
    }
    /// Host addresses that pods may get: all but the network address, the first host address
    /// (the node's own) and broadcast.
    pub fn pod_addresses(&self) -> impl Iterator<Item = Ipv4Addr> {
        let first = u32::from(self.network()) + 2;
        let last = u32::from(self.network()) | !self.mask();
        (first..last).map(Ipv4Addr::from)
    }
}

/// The names that one pod's network uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetNames {
    /// Network namespace name (under /run/netns): `<node>-<short uid>`, so each node (and the
    /// scripts that stop a node) can tell its own namespaces from those of the other nodes.
    pub netns: String,
    /// Host side of the veth pair: `nv<short uid>`.
    pub host_veth: String,
}

impl PodNetNames {
    /// Derives short, stable names from the node name and the pod UID (interface names are
    /// limited to 15 bytes, so the veth carries only the UID).
    pub fn for_uid(node: &str, uid: &str) -> Self {
        let short: String = uid.chars().filter(|c| c.is_ascii_hexdigit()).take(10).collect();
        Self::from_short(node, &short)
    }

    fn from_short(node: &str, short: &str) -> Self {
        Self {
            netns: format!("{node}-{short}"),
            host_veth: format!("nv{short}"),
        }
    }

    /// The names behind an existing namespace of `node`, if `netns` is one of its.
    pub fn of_namespace(node: &str, netns: &str) -> Option<Self> {
        let short = netns.strip_prefix(node)?.strip_prefix('-')?;
        (!short.is_empty() && short.chars().all(|c| c.is_ascii_hexdigit())).then(|| Self::from_short(node, short))
    }
    /// The namespace file to enter with setns(2).
    pub fn netns_path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.netns)
    }
}

/// Sets up and tears down the pod networks of one node on the shared bridge.
#[derive(Debug, Clone)]
pub struct PodNetwork {
    pub bridge: String,
    /// This node's pod addresses.
    pub cidr: Ipv4Net,
    /// What pods reach directly on the bridge: the whole cluster network when every node shares
    /// one bridge (the local Kubernetes), only the node's own range on a machine's own bridge.
    pub on_link: Ipv4Net,
    /// The node's address on the bridge: the pods' gateway.
    pub gateway: Ipv4Addr,
    /// The node name, which prefixes the node's network namespaces.
    pub node: String,
    ipam_dir: PathBuf,
}

/// The file (in the IPAM folder) that holds the address handed out last.
const LAST_ALLOCATED: &str = "last-allocated";

impl PodNetwork {
    pub fn new(
        bridge: String,
        node: String,
        cidr: Ipv4Net,
        on_link: Ipv4Net,
        gateway: Ipv4Addr,
        state_dir: &Path,
    ) -> Self {
        Self {
            bridge,
            cidr,
            on_link,
            gateway,
            node,
            ipam_dir: state_dir.join("ipam"),
        }
    }

    /// The names of one pod's network on this node.
    pub fn names(&self, uid: &str) -> PodNetNames {
        PodNetNames::for_uid(&self.node, uid)
    }

    /// Checks that the bridge exists (it carries the routes that keep traffic local).
    pub fn check_bridge(&self) -> Result<(), NetworkError> {
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            Ok(())
        } else {
            Err(NetworkError::NoBridge(self.bridge.clone()))
        }
    }

    /// The address held for `uid`, allocating one if it has none.
    pub fn allocate(&self, uid: &str) -> Result<Ipv4Addr, NetworkError> {
        let ipam_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| NetworkError::Ipam { path, source }
        };
        std::fs::create_dir_all(&self.ipam_dir).map_err(ipam_err(&self.ipam_dir))?;
        if let Some(ip) = self.held_by(uid)? {
            return Ok(ip);
        }
        // Addresses are handed out in turn, after the last one given, not lowest first: other
        // pods keep the hardware address of a gone pod's address in their neighbour tables for
        // a while, and would send a new holder's replies to the old one (seen as connections
        // that hang for seconds). In turn, an address comes back only after the rest of the
        // range has been used.
        let last_path = self.ipam_dir.join(LAST_ALLOCATED);
        let last: Option<Ipv4Addr> = std::fs::read_to_string(&last_path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let candidates: Vec<Ipv4Addr> = self.cidr.pod_addresses().filter(|ip| *ip != self.gateway).collect();
        let start = last
            .and_then(|last| candidates.iter().position(|ip| *ip == last))
            .map_or(0, |i| i + 1);
        for ip in candidates[start..].iter().chain(&candidates[..start]).copied() {
            let path = self.ipam_dir.join(ip.to_string());
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    use std::io::Write;
                    f.write_all(uid.as_bytes()).map_err(ipam_err(&path))?;
                    // Only a hint for the next allocation: losing it costs nothing but order.
                    let _ = std::fs::write(&last_path, ip.to_string());
                    return Ok(ip);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(ipam_err(&path)(e)),
            }
        }
        Err(NetworkError::Exhausted(self.cidr.to_string()))
    }

    /// The address currently held by `uid`, if any.
    pub fn held_by(&self, uid: &str) -> Result<Option<Ipv4Addr>, NetworkError> {
        Ok(self.holders()?.into_iter().find(|(_, u)| u == uid).map(|(ip, _)| ip))
    }

    /// Every held address and its pod UID.
    pub fn holders(&self) -> Result<Vec<(Ipv4Addr, String)>, NetworkError> {
        let entries = match std::fs::read_dir(&self.ipam_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(source) => {
                return Err(NetworkError::Ipam {
                    path: self.ipam_dir.clone(),
                    source,
                });
            }
        };
        let mut out = vec![];
        for entry in entries.flatten() {
            let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Ok(uid) = std::fs::read_to_string(entry.path()) {
                out.push((ip, uid));
            }
        }
        Ok(out)
    }

    /// Gives the address of `uid` back.
    pub fn release(&self, uid: &str) -> Result<(), NetworkError> {
        if let Some(ip) = self.held_by(uid)? {
            let path = self.ipam_dir.join(ip.to_string());
            if let Err(source) = std::fs::remove_file(&path)
                && source.kind() != std::io::ErrorKind::NotFound
            {
                return Err(NetworkError::Ipam { path, source });
            }
        }
        Ok(())
    }

    /// Creates the pod's namespace with `ip` on its eth0, idempotently: an existing namespace of
    /// the same name is removed first, so a half-made one from a crash never lingers.
    pub async fn create(&self, names: &PodNetNames, ip: Ipv4Addr) -> Result<(), NetworkError> {
        self.check_bridge()?;
        if names.netns_path().exists() {
            self.destroy(names).await?;
        }
        let ns = &names.netns;
        let veth = &names.host_veth;
        let prefix = self.on_link.prefix;
        let gateway = self.gateway;
        // Addresses are reused as soon as a pod is gone; this machine may still hold the old
        // pod's hardware address for it, and would send the new pod's packets nowhere until
        // that entry expires (half a minute or more): it is dropped first.
        let host_side = format!(
            "neigh flush to {ip} dev {bridge}\n\
             netns add {ns}\n\
             link add {veth} type veth peer name eth0 netns {ns}\n\
             link set {veth} master {bridge}\n\
             link set {veth} type bridge_slave hairpin on\n\
             link set {veth} up\n",
            bridge = self.bridge,
        );
        let pod_side = format!(
            "link set lo up\n\
             addr add {ip}/{prefix} dev eth0\n\
             link set eth0 up\n\
             route add default via {gateway} dev eth0\n"
        );
        // The same goes for other pods that knew the old owner of the address: with
        // arp_notify, the pod announces its address (gratuitous ARP) as its eth0 comes up.
        let arp_notify = ["netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.eth0.arp_notify=1"];
        let result = match run_ip_batch(&[], &host_side).await {
            Ok(()) => match run_ip(&arp_notify).await {
                Ok(()) => run_ip_batch(&["-n", ns], &pod_side).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if result.is_err() {
            // Leave nothing half made behind.
            let _ = self.destroy(names).await;
        }
        result
    }

    /// Removes the pod's namespace (which also removes its veth pair). Missing is fine.
    pub async fn destroy(&self, names: &PodNetNames) -> Result<(), NetworkError> {
        if Path::new("/sys/class/net").join(&names.host_veth).exists() {
            run_ip(&["link", "del", &names.host_veth]).await?;
        }
        if names.netns_path().exists() {
            run_ip(&["netns", "del", &names.netns]).await?;
        }
        Ok(())
    }

    /// The pod namespaces of this node that exist now (for cleaning up after a crash).
    pub fn existing_namespaces(&self) -> Vec<PodNetNames> {
        std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .filter_map(|n| PodNetNames::of_namespace(&self.node, &n))
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub(crate) async fn run_ip(args: &[&str]) -> Result<(), NetworkError> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| NetworkError::Ip {
            args: args.join(" "),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetworkError::Ip {
            args: args.join(" "),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

pub(crate) async fn run_ip_batch(global: &[&str], script: &str) -> Result<(), NetworkError> {
    let failed = |message: String| NetworkError::Ip {
        args: format!("{} -batch -", global.join(" ")),
        message,
    };
    let mut child = Command::new("ip")
        .args(global)
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
    }
    let out = child.wait_with_output().await.map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_arithmetic() {
        let net: Ipv4Net = "10.244.0.0/16".parse().unwrap();
        assert!(net.contains(Ipv4Addr::new(10, 244, 200, 3)));
        assert!(!net.contains(Ipv4Addr::new(10, 245, 0, 3)));
        let mut pods = net.pod_addresses();
        assert_eq!(pods.next(), Some(Ipv4Addr::new(10, 244, 0, 2)));
        assert_eq!(net.pod_addresses().last(), Some(Ipv4Addr::new(10, 244, 255, 254)));
        assert!("10.0.0.0/31".parse::<Ipv4Net>().is_err());
        assert!("10.0.0.0".parse::<Ipv4Net>().is_err());
    }

    #[test]
    fn names_fit_in_an_interface_name_and_say_their_node() {
        let n = PodNetNames::for_uid("noops-node-2", "6f1c2a3b-94de-4a5f-8e1a-0b2c3d4e5f60");
        assert_eq!(n.netns, "noops-node-2-6f1c2a3b94");
        assert_eq!(n.host_veth, "nv6f1c2a3b94");
        assert!(n.host_veth.len() <= 15);
        assert_eq!(PodNetNames::of_namespace("noops-node-2", &n.netns), Some(n.clone()));
        assert_eq!(
            PodNetNames::of_namespace("noops-node-1", &n.netns),
            None,
            "another node's"
        );
        assert_eq!(
            PodNetNames::of_namespace("noops-node-1", "noops-node-12-6f1c2a3b94"),
            None
        );
    }

    #[test]
    fn allocation_is_stable_per_uid_and_released() {
        let dir = std::env::temp_dir().join(format!("noops-ipam-test-{}", std::process::id()));
        let gateway = Ipv4Addr::new(10, 9, 0, 1);
        let cluster = "10.9.0.0/16".parse().unwrap();
        let net = PodNetwork::new(
            "br".into(),
            "n1".into(),
            "10.9.0.0/29".parse().unwrap(),
            cluster,
            gateway,
            &dir,
        );
        let a = net.allocate("uid-a").unwrap();
        let b = net.allocate("uid-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(net.allocate("uid-a").unwrap(), a);
        net.release("uid-a").unwrap();
        assert_eq!(net.held_by("uid-a").unwrap(), None);
        // A released address is not handed out again while others are free.
        let c = net.allocate("uid-c").unwrap();
        assert_ne!(c, a, "a freed address comes back only after the rest of the range");
        assert_eq!(net.holders().unwrap().len(), 2, "the hint file is not an address");
        // A /29 has 8 addresses: network, gateway, broadcast and 5 for pods.
        for i in 0..3 {
            net.allocate(&format!("more-{i}")).unwrap();
        }
        assert!(matches!(net.allocate("one-too-many"), Err(NetworkError::Exhausted(_))));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
