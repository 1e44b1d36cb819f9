//! Pod status: phase, conditions and container statuses, built from what the worker knows.
//! Pure functions; the worker applies the result with server-side apply only when it changed.

use serde_json::{Value, json};

/// What one container is doing now, as far as the pod phase is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum ContainerPhase {
    /// Not started yet (creating, or blocked by an error such as an unmapped image).
    NeverStarted,
    Running,
    /// Exited and will not be started again.
    Terminated {
        exit_code: i32,
    },
    /// Exited and waiting for its restart back-off.
    Restarting,
}

/// The pod phase by the kubelet's rules.
pub fn pod_phase(
    restart_policy: &str,
    init: &[ContainerPhase],
    init_done: bool,
    main: &[ContainerPhase],
) -> &'static str {
    let init_failed = init
        .iter()
        .any(|c| matches!(c, ContainerPhase::Terminated { exit_code } if *exit_code != 0));
    if init_failed && restart_policy == "Never" {
        return "Failed";
    }
    if !init_done {
        return "Pending";
    }
    let never_started = main.iter().filter(|c| **c == ContainerPhase::NeverStarted).count();
    let running = main.iter().filter(|c| **c == ContainerPhase::Running).count();
    let restarting = main.iter().filter(|c| **c == ContainerPhase::Restarting).count();
    let succeeded = main
        .iter()
        .filter(|c| matches!(c, ContainerPhase::Terminated { exit_code: 0 }))
        .count();
    let failed = main
        .iter()
        .filter(|c| matches!(c, ContainerPhase::Terminated { exit_code } if *exit_code != 0))
        .count();
    if never_started > 0 {
        return "Pending";
    }
    if running > 0 || restarting > 0 {
        return "Running";
    }
    if failed > 0 {
        return "Failed";
    }
    if succeeded == main.len() && !main.is_empty() {
        return "Succeeded";
    }
    "Pending"
}

/// One pod condition with the time its status last changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub since: jiff::Timestamp,
}

/// A container's state in the status.
#[derive(Debug, Clone, PartialEq)]
pub enum StateView {
    Waiting { reason: String, message: Option<String> },
    Running { started_at: jiff::Timestamp },
    Terminated(TerminatedView),
}

/// A finished container instance.
#[derive(Debug, Clone, PartialEq)]
pub struct TerminatedView {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: jiff::Timestamp,
    pub finished_at: jiff::Timestamp,
    pub container_id: String,
}

/// One container status.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    pub restart_count: i32,
    pub state: StateView,
    pub last_state: Option<TerminatedView>,
    pub ready: bool,
    pub started: bool,
    pub container_id: Option<String>,
}

/// Everything in a pod's status that the agent owns.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    pub phase: &'static str,
    pub host_ip: String,
    pub pod_ip: Option<String>,
    pub start_time: jiff::Timestamp,
    pub conditions: Vec<Condition>,
    pub init: Vec<ContainerView>,
    pub main: Vec<ContainerView>,
}

fn ts(t: &jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn terminated_json(t: &TerminatedView) -> Value {
    let mut v = json!({
        "exitCode": t.exit_code,
        "reason": t.reason,
        "startedAt": ts(&t.started_at),
        "finishedAt": ts(&t.finished_at),
        "containerID": t.container_id,
    });
    if let Some(s) = t.signal {
        v["signal"] = json!(s);
    }
    if let Some(m) = &t.message {
        v["message"] = json!(m);
    }
    v
}

fn container_json(c: &ContainerView) -> Value {
    let state = match &c.state {
        StateView::Waiting { reason, message } => {
            let mut w = json!({ "reason": reason });
            if let Some(m) = message {
                w["message"] = json!(m);
            }
            json!({ "waiting": w })
        }
        StateView::Running { started_at } => json!({ "running": { "startedAt": ts(started_at) } }),
        StateView::Terminated(t) => json!({ "terminated": terminated_json(t) }),
    };
    let mut v = json!({
        "name": c.name,
        "image": c.image,
        "imageID": format!("noops://{}", c.image),
        "restartCount": c.restart_count,
        "ready": c.ready,
        "started": c.started,
        "state": state,
        "lastState": c.last_state.as_ref().map(|t| json!({ "terminated": terminated_json(t) })).unwrap_or(json!({})),
    });
    if let Some(id) = &c.container_id {
        v["containerID"] = json!(id);
    }
    v
}

/// The status as a server-side-apply body for `pods/status`.
pub fn status_patch(view: &PodView) -> Value {
    let conditions: Vec<Value> = view
        .conditions
        .iter()
        .map(|c| {
            let mut v = json!({
                "type": c.type_,
                "status": if c.status { "True" } else { "False" },
                "lastProbeTime": null,
                "lastTransitionTime": ts(&c.since),
            });
            if let Some(r) = &c.reason {
                v["reason"] = json!(r);
            }
            if let Some(m) = &c.message {
                v["message"] = json!(m);
            }
            v
        })
        .collect();
    let mut status = json!({
        "phase": view.phase,
        "hostIP": view.host_ip,
        "hostIPs": [{ "ip": view.host_ip }],
        "startTime": ts(&view.start_time),
        "conditions": conditions,
        "containerStatuses": view.main.iter().map(container_json).collect::<Vec<_>>(),
    });
    if !view.init.is_empty() {
        status["initContainerStatuses"] = json!(view.init.iter().map(container_json).collect::<Vec<_>>());
    }
    if let Some(ip) = &view.pod_ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{ "ip": ip }]);
    }
    json!({ "apiVersion": "v1", "kind": "Pod", "status": status })
}

#[cfg(test)]
mod tests {
    use super::ContainerPhase::*;
    use super::*;

    #[test]
    fn phases() {
        assert_eq!(pod_phase("Always", &[], false, &[NeverStarted]), "Pending");
        assert_eq!(pod_phase("Always", &[], true, &[NeverStarted, Running]), "Pending");
        assert_eq!(pod_phase("Always", &[], true, &[Running, Restarting]), "Running");
        assert_eq!(
            pod_phase("Never", &[], true, &[Terminated { exit_code: 0 }]),
            "Succeeded"
        );
        assert_eq!(
            pod_phase(
                "Never",
                &[],
                true,
                &[Terminated { exit_code: 0 }, Terminated { exit_code: 2 }]
            ),
            "Failed"
        );
        assert_eq!(pod_phase("OnFailure", &[], true, &[Restarting]), "Running");
        assert_eq!(
            pod_phase("Never", &[Terminated { exit_code: 1 }], false, &[NeverStarted]),
            "Failed"
        );
        assert_eq!(pod_phase("Always", &[Restarting], false, &[NeverStarted]), "Pending");
        assert_eq!(
            pod_phase("Never", &[], true, &[Running, Terminated { exit_code: 0 }]),
            "Running"
        );
    }

    #[test]
    fn patch_shape() {
        let t = jiff::Timestamp::UNIX_EPOCH;
        let view = PodView {
            phase: "Running",
            host_ip: "10.244.0.1".into(),
            pod_ip: Some("10.244.0.9".into()),
            start_time: t,
            conditions: vec![Condition {
                type_: "Ready",
                status: true,
                reason: None,
                message: None,
                since: t,
            }],
            init: vec![],
            main: vec![ContainerView {
                name: "web".into(),
                image: "hashicorp/http-echo".into(),
                restart_count: 2,
                state: StateView::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: Some("back-off".into()),
                },
                last_state: Some(TerminatedView {
                    exit_code: 137,
                    signal: Some(9),
                    reason: "Error".into(),
                    message: None,
                    started_at: t,
                    finished_at: t,
                    container_id: "noops://x".into(),
                }),
                ready: false,
                started: false,
                container_id: None,
            }],
        };
        let p = status_patch(&view);
        assert_eq!(p["status"]["podIP"], "10.244.0.9");
        assert_eq!(p["status"]["conditions"][0]["status"], "True");
        let c = &p["status"]["containerStatuses"][0];
        assert_eq!(c["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(c["lastState"]["terminated"]["exitCode"], 137);
        assert!(p["status"].get("initContainerStatuses").is_none());
    }
}
