//! Traffic and counts a test keeps up while a tenant's machines change: a client polling an app
//! through a load balancer, and a PodDisruptionBudget checked at every change of the app's pods;
//! the apps themselves.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;

use crate::{http_get_from_port, pod_ready};

/// Requests through a load balancer, one every 100 ms, until stopped: how many were answered
/// and which failed.
pub struct Poller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
    /// What the request path looked like meanwhile, told when a request failed.
    paths: Vec<EndpointHistory>,
}

impl Poller {
    pub fn start(address: String) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut answered, mut failed) = (0, Vec::new());
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let started = std::time::Instant::now();
                let sent = jiff::Timestamp::now();
                // A generous limit: on a loaded machine a live pod can take seconds to answer.
                let (port, outcome) = http_get_from_port(&address, "/", Duration::from_secs(5)).await;
                match outcome {
                    Ok(body) if body.contains("hello") => answered += 1,
                    other => {
                        let failure = format!(
                            "sent {sent} from port {}, failed after {} ms: {other:?}",
                            port.map_or("?".to_string(), |p| p.to_string()),
                            started.elapsed().as_millis()
                        );
                        // An address no one answers for on the way: which, and where.
                        let unreachable = other.as_ref().is_err_and(|e| e.contains("No route to host"));
                        let seen = if unreachable {
                            unanswered_neighbours(&address, port).await
                        } else {
                            String::new()
                        };
                        failed.push(format!("{failure}{seen}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100).saturating_sub(started.elapsed())).await;
            }
            (answered, failed)
        });
        Self {
            stop,
            task,
            paths: vec![],
        }
    }

    /// Also follows the endpoints of a Service on the request's path (the load balancer's, the
    /// app's), so that a failed request can be matched with what changed there.
    pub fn following(mut self, path: EndpointHistory) -> Self {
        self.paths.push(path);
        self
    }

    pub async fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for path in &self.paths {
            path.task.abort();
        }
        self.task.await.unwrap()
    }

    /// Stops, asserting that no request failed and that more than `at_least` were answered.
    pub async fn stop_expecting_every_answer(self, at_least: usize) {
        let histories: Vec<String> = self.paths.iter().map(EndpointHistory::told).collect();
        let (answered, failed) = self.stop().await;
        assert!(
            failed.is_empty(),
            "{} of {} requests failed: {failed:#?}\n{}",
            failed.len(),
            answered + failed.len(),
            histories.join("\n")
        );
        assert!(answered > at_least, "only {answered} requests");
    }
}

/// What a "no route to host" leaves behind, whose cause is an address no one answered for on
/// some hop: the neighbours this machine and every network namespace on it (a machine's VM is
/// one) could not resolve lately, with how many seconds ago each was last used, confirmed and
/// updated; every tracked connection from the request's port, in any namespace (which hop
/// took it, translated to what, in which state); the rules this machine's kube-proxy has for
/// the address then; and where each VM's kube-proxy sends what it forwards.
async fn unanswered_neighbours(address: &str, port: Option<u16>) -> String {
    const SCRIPT: &str = r#"
ip=${1%:*}; port=$2
namespaces=$(ip netns list | awk '{print $1}')
ip -s -4 neigh show nud failed nud incomplete | sed 's/^/  this machine: /'
for ns in $namespaces; do
  seen=$(ip -n "$ns" -s -4 neigh show nud failed nud incomplete 2>/dev/null)
  [ -n "$seen" ] || continue
  own=$(ip -n "$ns" -4 -o addr show 2>/dev/null | awk '{print $2 "=" $4}' | tr '\n' ' ')
  echo "$seen" | sed "s|^|  $ns ($own): |"
done
if [ -n "$port" ]; then
  for ns in "" $namespaces; do
    if [ -z "$ns" ]; then at=""; else at="ip netns exec $ns"; fi
    # A dump of a busy table can be cut short ("interrupted system call"): tried again.
    for try in 1 2 3; do
      flows=$($at conntrack -L -p tcp --orig-port-src "$port" 2>/dev/null) && break
      flows="$flows (a dump cut short)"
    done
    [ -z "$flows" ] || echo "$flows" | sed "s|^|  conntrack ${ns:-this machine}: |"
  done
fi
iptables-save -t nat 2>/dev/null | grep -F -- "-d $ip/32" | sed 's/^/  kube-proxy of this machine: /'
for ns in $namespaces; do
  rules=$(ip netns exec "$ns" iptables-save -t nat 2>/dev/null)
  echo "$rules" | grep -q -- '--dport 30080' || continue
  to=$(echo "$rules" | grep -o -- '--to-destination [0-9.:]*' | awk '{print $2}' | sort -u | tr '\n' ' ')
  own=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')
  echo "  kube-proxy of $ns ($own) sends to: $to"
done
"#;
    let port = port.map(|p| p.to_string()).unwrap_or_default();
    let out = tokio::process::Command::new("bash")
        .args(["-c", SCRIPT, "neighbours", address, &port])
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    match out {
        Ok(out) => format!(
            "\n unresolved neighbours and tracked connections then:\n{}",
            String::from_utf8_lossy(&out.stdout)
        ),
        Err(e) => format!("\n (neighbours not read: {e})"),
    }
}

/// Every change of a Service's endpoints, from a watch of its EndpointSlices: each address with
/// its conditions, stamped with when the watch saw it.
pub struct EndpointHistory {
    what: String,
    task: tokio::task::JoinHandle<()>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl EndpointHistory {
    /// `what` names the Service in what is told (e.g. "management lb").
    pub fn start(what: &str, slices: Api<EndpointSlice>, service: &str) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let selector = format!("kubernetes.io/service-name={service}");
        let task = tokio::spawn(async move {
            let stream = watcher(slices, watcher::Config::default().labels(&selector));
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let line = match event {
                    Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => endpoints_line(&s),
                    Ok(watcher::Event::Delete(s)) => {
                        format!("{} deleted", s.metadata.name.unwrap_or_default())
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                    Err(e) => format!("watch error: {e}"),
                };
                record
                    .lock()
                    .unwrap()
                    .push(format!("{} {line}", jiff::Timestamp::now()));
            }
        });
        Self {
            what: what.to_string(),
            task,
            seen,
        }
    }

    fn told(&self) -> String {
        format!(
            "endpoints of the {} as they changed:\n  {}",
            self.what,
            self.seen.lock().unwrap().join("\n  ")
        )
    }
}

/// One slice's addresses with their conditions (r: ready, s: serving, t: terminating) and node.
fn endpoints_line(slice: &EndpointSlice) -> String {
    let endpoints: Vec<String> = slice
        .endpoints
        .iter()
        .map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            let flag = |v: Option<bool>, letter: &'static str| if v == Some(true) { letter } else { "-" };
            format!(
                "{}[{}{}{}]@{}",
                e.addresses.join(","),
                flag(c.ready, "r"),
                flag(c.serving, "s"),
                flag(c.terminating, "t"),
                e.node_name.as_deref().unwrap_or("?")
            )
        })
        .collect();
    format!(
        "{}: {}",
        slice.metadata.name.as_deref().unwrap_or_default(),
        endpoints.join(" ")
    )
}

/// Every change of the app's pods, from a watch: the fewest Ready at once, and how many changes
/// left fewer Ready than the budget's `min_available` (counted, not sampled).
pub struct BudgetWatch {
    task: tokio::task::JoinHandle<()>,
    seen: std::sync::Arc<std::sync::Mutex<(usize, usize, usize)>>,
}

impl BudgetWatch {
    pub fn start(pods: Api<Pod>, min_available: usize) -> Self {
        use futures::StreamExt;
        use kube::runtime::watcher;
        // (fewest Ready, changes below the budget, changes seen)
        let seen = std::sync::Arc::new(std::sync::Mutex::new((usize::MAX, 0, 0)));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut ready: std::collections::BTreeMap<String, bool> = Default::default();
            let stream = watcher(pods, watcher::Config::default().labels("app=web"));
            futures::pin_mut!(stream);
            let mut listed = false;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        ready.insert(p.metadata.name.clone().unwrap_or_default(), pod_ready(&p));
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        ready.remove(&p.metadata.name.clone().unwrap_or_default());
                    }
                    // A watch started again (the API server restarted, as in an upgrade) lists
                    // everything anew: counted once the list is whole.
                    Ok(watcher::Event::Init) => {
                        ready.clear();
                        listed = false;
                    }
                    Ok(watcher::Event::InitDone) => listed = true,
                    Err(_) => continue,
                }
                if listed {
                    let count = ready.values().filter(|r| **r).count();
                    let mut seen = record.lock().unwrap();
                    seen.0 = seen.0.min(count);
                    seen.1 += usize::from(count < min_available);
                    seen.2 += 1;
                }
            }
        });
        Self { task, seen }
    }

    /// (fewest Ready at once, changes below the budget, changes seen).
    pub fn stop(self) -> (usize, usize, usize) {
        self.task.abort();
        *self.seen.lock().unwrap()
    }

    /// Stops, asserting that no change of the app's pods left fewer than `min_available` Ready
    /// and that more than `at_least` changes were seen (the pods did move).
    pub fn stop_expecting_held(self, min_available: usize, at_least: usize) {
        let (lowest, below, changes) = self.stop();
        assert_eq!(
            below, 0,
            "the budget ({min_available}) was violated {below} times in {changes} changes of the app's pods (fewest Ready: {lowest})"
        );
        assert!(changes > at_least, "the pods moved: {changes} changes seen");
    }
}

/// The tenant's app `web`: `replicas` pods answering "hello" on 8080 that drain gracefully (a
/// 6 s preStop sleep), a budget of `min_available`, and a NodePort Service on 30080.
pub fn web_app(replicas: i32, min_available: i32) -> String {
    format!(
        "{}---\n{}---\n{}",
        web_deployment(replicas, false),
        budget("web", min_available),
        WEB_SERVICE
    )
}

/// The app `web` with no budget at all, at most one pod per node (a required anti-affinity): a
/// drain evicts at most one of its pods, so it keeps answering only if machines are drained no
/// faster than their pods find room elsewhere.
pub fn web_app_without_budget(replicas: i32) -> String {
    format!("{}---\n{}", web_deployment(replicas, true), WEB_SERVICE)
}

/// The app `held`: one pod and a budget that allows no eviction, so the drain of its node waits
/// until the budget is deleted.
pub fn held_app() -> String {
    let echo = crate::root().join("target/debug/http-echo");
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: held, namespace: default }}
spec:
  replicas: 1
  selector: {{ matchLabels: {{ app: held }} }}
  template:
    metadata: {{ labels: {{ app: held }} }}
    spec:
      containers: [{{ name: held, image: busybox, command: ["{}", "-listen=:8081", "-text=held"] }}]
---
{}"#,
        echo.display(),
        budget("held", 1)
    )
}

fn web_deployment(replicas: i32, one_per_node: bool) -> String {
    let echo = crate::root().join("target/debug/http-echo");
    let spread = if one_per_node {
        "\n      affinity: { podAntiAffinity: { requiredDuringSchedulingIgnoredDuringExecution: [{ topologyKey: kubernetes.io/hostname, labelSelector: { matchLabels: { app: web } } }] } }"
    } else {
        ""
    };
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: web, namespace: default }}
spec:
  replicas: {replicas}
  selector: {{ matchLabels: {{ app: web }} }}
  template:
    metadata: {{ labels: {{ app: web }} }}
    spec:
      terminationGracePeriodSeconds: 30{spread}
      containers:
        - name: web
          image: busybox
          command: ["{}", "-listen=:8080", "-text=hello"]
          readinessProbe: {{ httpGet: {{ path: /health, port: 8080 }}, periodSeconds: 1 }}
          lifecycle: {{ preStop: {{ sleep: {{ seconds: 6 }} }} }}
"#,
        echo.display()
    )
}

/// A PodDisruptionBudget `name` of the pods labelled `app: <name>`.
fn budget(name: &str, min_available: i32) -> String {
    format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{ name: {name}, namespace: default }}\nspec: {{ minAvailable: {min_available}, selector: {{ matchLabels: {{ app: {name} }} }} }}\n"
    )
}

const WEB_SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata: { name: web, namespace: default }
spec:
  type: NodePort
  selector: { app: web }
  ports: [{ port: 80, targetPort: 8080, nodePort: 30080 }]
"#;

/// A Service `lb` of this cluster in front of the NodePort 30080 of control plane `cluster`'s
/// machines, as a cloud's load balancer would be; its address, once the app answers there.
pub async fn load_balancer(ns: &crate::TestNamespace, cluster: &str) -> String {
    ns.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: lb }}\nspec:\n  selector: {{ noops.dev/cluster: {cluster}, app.kubernetes.io/component: vm }}\n  ports: [{{ port: 80, targetPort: 30080 }}]\n"
    ));
    let lb = ns.api::<k8s_openapi::api::core::v1::Service>().get("lb").await.unwrap();
    let cluster_ip = lb.spec.unwrap().cluster_ip.unwrap();
    let address = format!("{cluster_ip}:80");
    // Probed only once this machine's kube-proxy sends the address to the endpoints: a probe
    // sent before goes to the bare address, and the kernel keeps that connection, untranslated,
    // for two minutes.
    crate::wait_until(
        "this machine's kube-proxy to send the load balancer's address to its endpoints",
        Duration::from_secs(60),
        || async { kube_proxy_routes(&cluster_ip).await },
    )
    .await;
    // Twenty answers in a row, each on a connection of its own: a traffic check starts on a
    // load balancer that answers steadily, not on its first answer (a stale endpoint after the
    // pool's last scaling).
    crate::wait_until(
        "the load balancer to answer 20 times in a row",
        Duration::from_secs(60),
        || async {
            for _ in 0..20 {
                let answered = crate::http_get_within(&address, "/", Duration::from_secs(1))
                    .await
                    .is_some_and(|b| b.contains("hello"));
                if !answered {
                    return false;
                }
            }
            true
        },
    )
    .await;
    address
}

/// Whether this machine's kube-proxy sends a Service's cluster IP to its endpoints.
async fn kube_proxy_routes(cluster_ip: &str) -> bool {
    let Ok(out) = tokio::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .await
    else {
        return false;
    };
    let destination = format!("-d {cluster_ip}/32 ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|rule| rule.contains(&destination) && rule.contains("-j KUBE-SVC-"))
}
