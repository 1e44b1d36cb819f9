//! Pod status: phase, conditions and container statuses, built from what the worker knows.
//! Pure functions; the worker applies the result with server-side apply only when it changed.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::decide::RestartPolicy;

/// The pod phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }

    /// The phase a pod status names, if it names one.
    pub fn parse(phase: Option<&str>) -> Option<Self> {
        match phase? {
            "Pending" => Some(Self::Pending),
            "Running" => Some(Self::Running),
            "Succeeded" => Some(Self::Succeeded),
            "Failed" => Some(Self::Failed),
            _ => None,
        }
    }

    /// Succeeded or Failed: nothing runs any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

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
    restart_policy: RestartPolicy,
    init: &[ContainerPhase],
    init_done: bool,
    main: &[ContainerPhase],
) -> PodPhase {
    let init_failed = init
        .iter()
        .any(|c| matches!(c, ContainerPhase::Terminated { exit_code } if *exit_code != 0));
    if init_failed && restart_policy == RestartPolicy::Never {
        return PodPhase::Failed;
    }
    if !init_done {
        return PodPhase::Pending;
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
        return PodPhase::Pending;
    }
    if running > 0 || restarting > 0 {
        return PodPhase::Running;
    }
    if failed > 0 {
        return PodPhase::Failed;
    }
    if succeeded == main.len() && !main.is_empty() {
        return PodPhase::Succeeded;
    }
    PodPhase::Pending
}

/// What the pod conditions are made of.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConditionFacts {
    /// The pod's network and volumes exist and it is not finished.
    pub sandbox_ready: bool,
    /// Every init container has succeeded.
    pub initialized: bool,
    /// The pod has finished (Succeeded or Failed).
    pub terminal: bool,
    /// Main containers that are not running and Ready.
    pub not_ready: Vec<String>,
    /// Every readiness gate of the spec is True.
    pub gates_ok: bool,
}

/// The four pod conditions the kubelet reports, with their reasons; `since` comes from
/// [`Transitions`].
pub fn pod_conditions(facts: &ConditionFacts, transitions: &mut Transitions, now: jiff::Timestamp) -> Vec<Condition> {
    let containers_ready = !facts.terminal && facts.not_ready.is_empty();
    let mut conditions = vec![
        transitions.condition("PodReadyToStartContainers", facts.sandbox_ready, now),
        transitions.condition("Initialized", facts.initialized, now),
        transitions.condition("ContainersReady", containers_ready, now),
        transitions.condition("Ready", containers_ready && facts.gates_ok, now),
    ];
    for c in conditions.iter_mut().filter(|c| !c.status) {
        match c.type_ {
            "ContainersReady" | "Ready" if facts.terminal => c.reason = Some("PodCompleted".into()),
            "ContainersReady" | "Ready" => {
                c.reason = Some("ContainersNotReady".into());
                c.message = Some(format!(
                    "containers with unready status: [{}]",
                    facts.not_ready.join(" ")
                ));
            }
            "Initialized" => c.reason = Some("ContainersNotInitialized".into()),
            _ => {}
        }
    }
    conditions
}

/// When each condition last changed its status (kept by the worker for its pod).
#[derive(Debug, Clone, Default)]
pub struct Transitions {
    since: BTreeMap<&'static str, (bool, jiff::Timestamp)>,
}

impl Transitions {
    fn condition(&mut self, type_: &'static str, status: bool, now: jiff::Timestamp) -> Condition {
        let entry = self.since.entry(type_).or_insert((status, now));
        if entry.0 != status {
            *entry = (status, now);
        }
        Condition {
            type_,
            status,
            reason: None,
            message: None,
            since: entry.1,
        }
    }
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
    pub phase: PodPhase,
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
        "phase": view.phase.as_str(),
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
        use PodPhase::{Failed, Pending, Succeeded};
        use RestartPolicy::{Always, Never, OnFailure};
        assert_eq!(pod_phase(Always, &[], false, &[NeverStarted]), Pending);
        assert_eq!(pod_phase(Always, &[], true, &[NeverStarted, Running]), Pending);
        assert_eq!(pod_phase(Always, &[], true, &[Running, Restarting]), PodPhase::Running);
        assert_eq!(pod_phase(Never, &[], true, &[Terminated { exit_code: 0 }]), Succeeded);
        assert_eq!(
            pod_phase(
                Never,
                &[],
                true,
                &[Terminated { exit_code: 0 }, Terminated { exit_code: 2 }]
            ),
            Failed
        );
        assert_eq!(pod_phase(OnFailure, &[], true, &[Restarting]), PodPhase::Running);
        assert_eq!(
            pod_phase(Never, &[Terminated { exit_code: 1 }], false, &[NeverStarted]),
            Failed
        );
        assert_eq!(pod_phase(Always, &[Restarting], false, &[NeverStarted]), Pending);
        assert_eq!(
            pod_phase(Never, &[], true, &[Running, Terminated { exit_code: 0 }]),
            PodPhase::Running
        );
    }

    #[test]
    fn conditions_say_why_a_pod_is_not_ready_and_keep_their_transition_times() {
        let t0 = jiff::Timestamp::from_second(100).unwrap();
        let t1 = jiff::Timestamp::from_second(200).unwrap();
        let mut transitions = Transitions::default();
        let starting = ConditionFacts {
            sandbox_ready: true,
            initialized: true,
            not_ready: vec!["web".into()],
            gates_ok: true,
            ..Default::default()
        };
        let c = pod_conditions(&starting, &mut transitions, t0);
        let ready = c.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(!ready.status);
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(ready.message.as_deref(), Some("containers with unready status: [web]"));
        let running = ConditionFacts {
            not_ready: vec![],
            ..starting.clone()
        };
        let c = pod_conditions(&running, &mut transitions, t1);
        let ready = c.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(ready.status && ready.reason.is_none());
        assert_eq!(ready.since, t1, "Ready flipped");
        let initialized = c.iter().find(|c| c.type_ == "Initialized").unwrap();
        assert_eq!(initialized.since, t0, "Initialized did not");
        let gated = ConditionFacts {
            gates_ok: false,
            ..running.clone()
        };
        let c = pod_conditions(&gated, &mut transitions, t1);
        assert!(c.iter().any(|c| c.type_ == "ContainersReady" && c.status));
        assert!(
            c.iter().any(|c| c.type_ == "Ready" && !c.status),
            "a readiness gate holds Ready"
        );
        let done = ConditionFacts {
            terminal: true,
            ..running
        };
        let c = pod_conditions(&done, &mut transitions, t1);
        let ready = c.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.reason.as_deref(), Some("PodCompleted"));
    }

    #[test]
    fn patch_shape() {
        let t = jiff::Timestamp::UNIX_EPOCH;
        let view = PodView {
            phase: PodPhase::Running,
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
