//! What to do with a pod's containers now, decided from the pod spec and what the worker
//! observed of each container, as the kubelet's `computePodActions` does. Pure: the worker
//! carries the decisions out.
//!
//! - Init containers run one at a time, in order; the next starts only once the one before has
//!   succeeded, and the main containers only once all have.
//! - A container that exits is started again if the restart policy says so, after its
//!   back-off; an init container that succeeds is done.
//! - A container that ran long enough without crashing starts its back-off afresh.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::backoff::Backoff;

/// A container that ran this long without crashing starts its back-off afresh (the kubelet's).
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);
/// Longest back-off between restarts of a crashing container (the kubelet's).
pub const MAX_CRASH_BACKOFF: Duration = Duration::from_secs(300);

/// The pod's `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The policy of `pod` (`Always` when unset or unknown, as the API server defaults it).
    pub fn of(pod: &Pod) -> Self {
        match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
            Some("Never") => Self::Never,
            Some("OnFailure") => Self::OnFailure,
            _ => Self::Always,
        }
    }

    /// Whether a container that exited with `exit_code` is started again.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            Self::Always => true,
            Self::OnFailure => exit_code != 0,
            Self::Never => false,
        }
    }
}

/// What the decision needs to know about one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContainerFacts {
    pub running: bool,
    /// The exit code of its last instance, if one ran and ended.
    pub exit_code: Option<i32>,
    /// An init container that succeeded.
    pub completed: bool,
    /// When it may (re)start: the end of its back-off or of a retry delay.
    pub start_at: Option<Instant>,
}

/// A container to start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Init(usize),
    Main(usize),
}

/// The containers to start now. At most one init container at a time, in order; the main
/// containers once every init container has completed.
pub fn containers_to_start(
    policy: RestartPolicy,
    init: &[ContainerFacts],
    main: &[ContainerFacts],
    now: Instant,
) -> Vec<Start> {
    for (idx, c) in init.iter().enumerate() {
        if c.completed {
            continue;
        }
        let blocked = c.running
            || (c.exit_code.is_some() && policy == RestartPolicy::Never)
            || c.start_at.is_some_and(|at| now < at);
        return if blocked { vec![] } else { vec![Start::Init(idx)] };
    }
    main.iter()
        .enumerate()
        .filter(|(_, c)| !c.running)
        .filter(|(_, c)| match (c.exit_code, c.start_at) {
            (_, Some(at)) => now >= at,
            (None, None) => true,
            (Some(_), None) => false,
        })
        .map(|(idx, _)| Start::Main(idx))
        .collect()
}

/// What follows a container's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// An init container that succeeded: the next one (or the main containers) may start.
    Completed,
    /// Started again once the back-off has passed (`CrashLoopBackOff` until then).
    RestartAfter(Duration),
    /// Left as it ended.
    Stays,
}

/// Decides what follows the exit of a container that ran for `ran_for`, and moves its back-off.
pub fn after_exit(
    policy: RestartPolicy,
    init: bool,
    exit_code: i32,
    ran_for: Duration,
    backoff: &mut Backoff,
) -> AfterExit {
    if ran_for >= BACKOFF_RESET_AFTER {
        backoff.reset();
    }
    if init && exit_code == 0 {
        return AfterExit::Completed;
    }
    if !policy.restarts(exit_code) {
        return AfterExit::Stays;
    }
    AfterExit::RestartAfter(backoff.next_delay())
}

/// Whether a container that had finished before this agent started (its end read from the pod
/// status) is started again: a succeeded init container never is; the others as the restart
/// policy says.
pub fn restart_restored(policy: RestartPolicy, completed: bool, exit_code: i32) -> bool {
    match policy {
        RestartPolicy::Never => false,
        RestartPolicy::OnFailure => exit_code != 0,
        RestartPolicy::Always => !completed,
    }
}

#[cfg(test)]
mod tests {
    use super::RestartPolicy::*;
    use super::*;

    const RUNNING: ContainerFacts = ContainerFacts {
        running: true,
        exit_code: None,
        completed: false,
        start_at: None,
    };
    const NEW: ContainerFacts = ContainerFacts {
        running: false,
        exit_code: None,
        completed: false,
        start_at: None,
    };
    const DONE: ContainerFacts = ContainerFacts {
        running: false,
        exit_code: Some(0),
        completed: true,
        start_at: None,
    };

    fn exited(code: i32, start_at: Option<Instant>) -> ContainerFacts {
        ContainerFacts {
            running: false,
            exit_code: Some(code),
            completed: false,
            start_at,
        }
    }

    fn backoff() -> Backoff {
        Backoff::first_free(Duration::from_secs(10), MAX_CRASH_BACKOFF)
    }

    #[test]
    fn the_policy_comes_from_the_pod_and_defaults_to_always() {
        let mut pod = Pod::default();
        assert_eq!(RestartPolicy::of(&pod), Always);
        for (text, policy) in [("Never", Never), ("OnFailure", OnFailure), ("Always", Always)] {
            pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                restart_policy: Some(text.into()),
                ..Default::default()
            });
            assert_eq!(RestartPolicy::of(&pod), policy);
        }
    }

    #[test]
    fn every_policy_says_which_exits_restart() {
        assert!(Always.restarts(0) && Always.restarts(1));
        assert!(!OnFailure.restarts(0) && OnFailure.restarts(1));
        assert!(!Never.restarts(0) && !Never.restarts(1));
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order_before_the_main_ones() {
        let now = Instant::now();
        assert_eq!(
            containers_to_start(Always, &[NEW, NEW], &[NEW], now),
            vec![Start::Init(0)],
            "the first init container, and only it"
        );
        assert_eq!(
            containers_to_start(Always, &[RUNNING, NEW], &[NEW], now),
            vec![],
            "wait for the running one"
        );
        assert_eq!(
            containers_to_start(Always, &[DONE, NEW], &[NEW], now),
            vec![Start::Init(1)]
        );
        assert_eq!(
            containers_to_start(Always, &[DONE, DONE], &[NEW, NEW], now),
            vec![Start::Main(0), Start::Main(1)],
            "then every main container at once"
        );
    }

    #[test]
    fn a_failed_init_container_blocks_the_pod_or_waits_for_its_back_off() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        assert_eq!(
            containers_to_start(Never, &[exited(1, None)], &[NEW], now),
            vec![],
            "Never: the pod has failed"
        );
        for policy in [Always, OnFailure] {
            assert_eq!(
                containers_to_start(policy, &[exited(1, Some(later))], &[NEW], now),
                vec![]
            );
            assert_eq!(
                containers_to_start(policy, &[exited(1, Some(later))], &[NEW], later),
                vec![Start::Init(0)]
            );
        }
    }

    #[test]
    fn main_containers_start_when_new_or_when_their_back_off_ends() {
        let now = Instant::now();
        let later = now + Duration::from_secs(20);
        let main = [RUNNING, NEW, exited(1, Some(later)), exited(0, None)];
        assert_eq!(containers_to_start(Always, &[], &main, now), vec![Start::Main(1)]);
        assert_eq!(
            containers_to_start(Always, &[], &main, later),
            vec![Start::Main(1), Start::Main(2)],
            "an exited container without a planned start stays down"
        );
    }

    #[test]
    fn exits_restart_by_policy_with_a_growing_back_off() {
        let short = Duration::from_secs(1);
        for (policy, code, expected) in [
            (Always, 0, true),
            (Always, 1, true),
            (OnFailure, 0, false),
            (OnFailure, 1, true),
            (Never, 0, false),
            (Never, 1, false),
        ] {
            let decision = after_exit(policy, false, code, short, &mut backoff());
            assert_eq!(
                matches!(decision, AfterExit::RestartAfter(_)),
                expected,
                "{policy:?} exit {code}: {decision:?}"
            );
        }
        let mut b = backoff();
        let delays: Vec<AfterExit> = (0..4).map(|_| after_exit(Always, false, 1, short, &mut b)).collect();
        assert_eq!(
            delays,
            [0, 10, 20, 40].map(|s| AfterExit::RestartAfter(Duration::from_secs(s))),
            "the first crash restarts at once, as the kubelet's does"
        );
        assert_eq!(
            after_exit(Always, false, 1, BACKOFF_RESET_AFTER, &mut b),
            AfterExit::RestartAfter(Duration::ZERO),
            "a long run starts the back-off afresh"
        );
    }

    #[test]
    fn an_init_container_completes_on_success_and_restarts_on_failure_unless_never() {
        let short = Duration::from_secs(1);
        for policy in [Always, OnFailure, Never] {
            assert_eq!(after_exit(policy, true, 0, short, &mut backoff()), AfterExit::Completed);
        }
        assert_eq!(
            after_exit(Always, true, 1, short, &mut backoff()),
            AfterExit::RestartAfter(Duration::ZERO)
        );
        assert_eq!(after_exit(Never, true, 1, short, &mut backoff()), AfterExit::Stays);
    }

    #[test]
    fn containers_finished_before_the_agent_started_come_back_as_the_policy_says() {
        assert!(restart_restored(Always, false, 0));
        assert!(!restart_restored(Always, true, 0), "a succeeded init container is done");
        assert!(restart_restored(OnFailure, false, 1));
        assert!(!restart_restored(OnFailure, false, 0));
        assert!(!restart_restored(Never, false, 1));
    }
}
