//! The operator's only way to talk to etcd: the `etcd-client` crate, to members by pod IP (the
//! operator may run outside the cluster), over TLS with the cluster's client certificate,
//! checking the server certificate against the client Service's name.
//!
//! Every call is bounded in time, and the membership calls are idempotent: adding a learner
//! whose URL etcd already knows returns the member it has, promoting a voter or removing a
//! member that is gone succeeds, so a step retried after a crash or a lost answer goes on.

use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, MemberAddOptions, TlsOptions};

/// How long to wait for a connection, and for an answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a defragmentation may take.
const DEFRAGMENT_TIMEOUT: Duration = Duration::from_secs(300);
/// The key the read check counts (it need not exist: only the read's success matters).
const READ_CHECK_KEY: &str = "noops/read-check";

/// A failure talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no member to talk to")]
    NoEndpoint,
    #[error("{0}")]
    Client(#[from] etcd_client::Error),
    #[error("learner {0:x} is not yet in sync with the leader")]
    NotInSync(u64),
    /// etcd refused a membership change for now (a member joined too recently, a leader
    /// election is going on): the same call later may succeed.
    #[error("etcd is not ready for the change: {0}")]
    NotNow(String),
}

impl EtcdError {
    /// The call may succeed if made again shortly, with nothing else changed.
    pub fn not_now(&self) -> bool {
        matches!(self, EtcdError::NotInSync(_) | EtcdError::NotNow(_))
    }
}

/// What etcd says when a membership change is unsafe or impossible for the moment.
const NOT_NOW: [&str; 6] = [
    "unhealthy cluster",
    "leader changed",
    "no leader",
    // A move of leadership asked of a member that stopped leading a moment ago.
    "not leader",
    "too many requests",
    "too many learner members",
];

/// Sorts etcd's "not now" answers from real failures.
fn classify(e: etcd_client::Error) -> EtcdError {
    let text = e.to_string();
    if NOT_NOW.iter().any(|m| text.contains(m)) {
        EtcdError::NotNow(text)
    } else {
        EtcdError::Client(e)
    }
}

/// The client certificate, key and CA (PEM), and the name the servers' certificate carries.
#[derive(Clone)]
pub struct Credentials {
    pub ca: String,
    pub cert: String,
    pub key: String,
    pub server_name: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// A member as etcd lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedMember {
    pub id: u64,
    /// Empty until the member has started.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub learner: bool,
}

/// What one member says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberHealth {
    pub id: u64,
    pub cluster_id: u64,
    pub leader: u64,
    pub version: String,
    pub learner: bool,
    pub raft_index: u64,
    pub db_size: i64,
    /// How much of its database file is in use.
    pub db_size_in_use: i64,
    /// Alarms and other errors it reports.
    pub errors: Vec<String>,
}

impl MemberHealth {
    /// It has a leader and reports no error.
    pub fn healthy(&self) -> bool {
        self.leader != 0 && self.errors.is_empty()
    }
}

/// A snapshot being streamed from a member.
pub struct Snapshot {
    /// The revision the member was at when the snapshot began (the snapshot holds at least it).
    pub revision: i64,
    pub cluster_id: u64,
    /// The member's etcd version.
    pub version: String,
    /// The snapshot's bytes, in chunks.
    pub stream: etcd_client::SnapshotStreaming,
}

/// Access to one cluster's members.
#[derive(Debug, Clone)]
pub struct EtcdAccess {
    credentials: Option<Credentials>,
}

impl EtcdAccess {
    /// Access with `credentials`, or in plain text without.
    pub fn new(credentials: Option<Credentials>) -> Self {
        Self { credentials }
    }

    async fn connect(&self, endpoints: &[String]) -> Result<Client, EtcdError> {
        self.connect_with(endpoints, REQUEST_TIMEOUT).await
    }

    /// A client whose requests may each take up to `timeout`.
    async fn connect_with(&self, endpoints: &[String], timeout: Duration) -> Result<Client, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoint);
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(timeout);
        if let Some(c) = &self.credentials {
            options = options.with_tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(&c.ca))
                    .identity(Identity::from_pem(&c.cert, &c.key))
                    .domain_name(c.server_name.clone()),
            );
        }
        Ok(Client::connect(endpoints, Some(options)).await?)
    }

    /// What the member at `endpoint` says of itself.
    pub async fn health(&self, endpoint: &str) -> Result<MemberHealth, EtcdError> {
        let call = async {
            let mut client = self.connect(&[endpoint.to_string()]).await?;
            let status = client.status().await?;
            let header = status.header();
            Ok::<_, EtcdError>(MemberHealth {
                id: header.map(|h| h.member_id()).unwrap_or_default(),
                cluster_id: header.map(|h| h.cluster_id()).unwrap_or_default(),
                leader: status.leader(),
                version: status.version().to_string(),
                learner: status.is_learner(),
                raft_index: status.raft_index(),
                db_size: status.db_size(),
                db_size_in_use: status.raft_used_db_size(),
                errors: status.errors().to_vec(),
            })
        };
        tokio::time::timeout(CONNECT_TIMEOUT + REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| EtcdError::Client(etcd_client::Error::InvalidArgs("status timed out".into())))?
    }

    /// The members, as the cluster (reached through `endpoints`) lists them.
    pub async fn members(&self, endpoints: &[String]) -> Result<Vec<ListedMember>, EtcdError> {
        let mut client = self.connect(endpoints).await?;
        let list = client.member_list().await?;
        Ok(list
            .members()
            .iter()
            .map(|m| ListedMember {
                id: m.id(),
                name: m.name().to_string(),
                peer_urls: m.peer_urls().to_vec(),
                learner: m.is_learner(),
            })
            .collect())
    }

    /// Adds a learner with `peer_url`; returns its ID (the one etcd already has for that URL if
    /// an earlier attempt added it).
    pub async fn add_learner(&self, endpoints: &[String], peer_url: &str) -> Result<u64, EtcdError> {
        let mut client = self.connect(endpoints).await?;
        match client
            .member_add([peer_url], Some(MemberAddOptions::new().with_is_learner()))
            .await
        {
            Ok(added) => Ok(added.member().map(|m| m.id()).unwrap_or_default()),
            // Added already: by an earlier call whose answer was lost, or by a retry of this
            // one within the same second (etcd derives the ID from the URL and the time, so
            // that retry is refused as a duplicate ID).
            Err(e)
                if e.to_string().contains("Peer URLs already exists")
                    || e.to_string().contains("peerURL exists")
                    || e.to_string().contains("member ID already exist") =>
            {
                let members = client.member_list().await?;
                members
                    .members()
                    .iter()
                    .find(|m| m.peer_urls().iter().any(|u| u == peer_url))
                    .map(|m| m.id())
                    .ok_or(EtcdError::Client(e))
            }
            Err(e) => Err(classify(e)),
        }
    }

    /// Promotes learner `id`. A member that already votes is fine (a promote can succeed and
    /// still fail to answer); a learner not yet in sync is [`EtcdError::NotInSync`].
    pub async fn promote(&self, endpoints: &[String], id: u64) -> Result<(), EtcdError> {
        let mut client = self.connect(endpoints).await?;
        match client.member_promote(id).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("in sync with leader") => Err(EtcdError::NotInSync(id)),
            Err(e) if e.to_string().contains("can only promote a learner member") => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    /// Removes member `id`; one that is already gone is fine.
    pub async fn remove(&self, endpoints: &[String], id: u64) -> Result<(), EtcdError> {
        let mut client = self.connect(endpoints).await?;
        match client.member_remove(id).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("member not found") => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    /// Starts a snapshot of the member at `endpoint`: what it says of itself first (the
    /// snapshot holds at least that revision), then the stream of the snapshot's bytes.
    pub async fn snapshot(&self, endpoint: &str) -> Result<Snapshot, EtcdError> {
        let mut client = self.connect(&[endpoint.to_string()]).await?;
        let status = client.status().await?;
        let header = status.header();
        let stream = client.snapshot().await?;
        Ok(Snapshot {
            revision: header.map(|h| h.revision()).unwrap_or_default(),
            cluster_id: header.map(|h| h.cluster_id()).unwrap_or_default(),
            version: status.version().to_string(),
            stream,
        })
    }

    /// A linearizable read through the member at `endpoint` (it must reach the leader and
    /// agree with it): the check between members of a rolling upgrade.
    pub async fn read_through(&self, endpoint: &str) -> Result<(), EtcdError> {
        let mut client = self.connect(&[endpoint.to_string()]).await?;
        client
            .get(READ_CHECK_KEY, Some(GetOptions::new().with_count_only()))
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Defragments the member at `endpoint` (it serves nothing meanwhile); a large database
    /// takes a while, so this call waits longer than the others.
    pub async fn defragment(&self, endpoint: &str) -> Result<(), EtcdError> {
        let mut client = self.connect_with(&[endpoint.to_string()], DEFRAGMENT_TIMEOUT).await?;
        client.defragment().await.map_err(classify)?;
        Ok(())
    }

    /// Asks the leader (at `leader_endpoint`) to hand leadership to `to`.
    pub async fn move_leader(&self, leader_endpoint: &str, to: u64) -> Result<(), EtcdError> {
        let mut client = self.connect(&[leader_endpoint.to_string()]).await?;
        client.move_leader(to).await.map_err(classify)?;
        Ok(())
    }
}
