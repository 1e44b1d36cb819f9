//! What a pass does next, from what it observed: the version each part runs, in the order a
//! Kubernetes upgrade needs (etcd, then the API servers, then the controller-manager and the
//! scheduler), and what is waited for. Pure: the progress of an upgrade is read back from the
//! children themselves (the version of each Deployment's image, and whether it has rolled
//! out), so a restarted operator carries on where the last one stopped.

use super::names::Component;
use super::observe::Facts;
use super::versions::Release;

/// Which part an upgrade (or the first start) is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The tenant's etcd is made, or moved to the release's etcd version.
    Etcd,
    /// The API servers are started, or replaced one by one.
    ApiServer,
    /// The controller-manager and the scheduler follow.
    Controllers,
    /// Every part runs the release.
    Done,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Etcd => "Etcd",
            Step::ApiServer => "APIServer",
            Step::Controllers => "ControllersAndScheduler",
            Step::Done => "Done",
        }
    }
}

/// The pass's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The release the spec asks for.
    pub target: Release,
    /// The etcd version the EtcdCluster is given (never lower than it runs).
    pub etcd_version: String,
    /// The release each Deployment is given; `None`: not made yet (what it waits for first).
    pub api_server: Option<Release>,
    pub controllers: Option<Release>,
    /// Where the rollout is.
    pub step: Step,
    /// What it waits for, in words (for the Progressing condition).
    pub waiting_for: Option<String>,
}

/// The higher of two etcd versions (`3.5.35` < `3.6.16`).
fn higher_etcd(a: &str, b: &str) -> String {
    let key = |v: &str| -> Vec<u32> { v.split('.').filter_map(|p| p.parse().ok()).collect() };
    if key(a) >= key(b) { a.into() } else { b.into() }
}

/// Plans the pass for `target` from `facts`.
pub fn plan(target: Release, facts: &Facts) -> Plan {
    let etcd_version = match &facts.etcd_spec_version {
        Some(live) => higher_etcd(live, &target.etcd),
        None => target.etcd.clone(),
    };
    let etcd_ready = facts.etcd_ready && facts.etcd_version.as_deref() == Some(etcd_version.as_str());
    let etcd_usable = etcd_ready && facts.etcd_client_secret;
    let api_live = facts.release_of(Component::ApiServer);
    let controllers_live = facts.release_of(Component::ControllerManager);

    let (api_server, api_at_target) = if etcd_usable {
        let done = facts.rolled_out(Component::ApiServer, &target);
        (Some(target.clone()), done)
    } else {
        // etcd first: the API servers stay as they are (or are not made yet).
        (api_live.clone(), false)
    };
    let controllers = if api_at_target {
        Some(target.clone())
    } else {
        controllers_live.clone()
    };
    let controllers_done = api_at_target
        && facts.rolled_out(Component::ControllerManager, &target)
        && facts.rolled_out(Component::Scheduler, &target);
    let (step, waiting_for) = if !etcd_usable {
        let what = if !facts.etcd_ready || facts.etcd_version.as_deref() != Some(etcd_version.as_str()) {
            format!("etcd {} to be Ready", etcd_version)
        } else {
            "the etcd client certificate".to_string()
        };
        (Step::Etcd, Some(what))
    } else if !api_at_target {
        let what = format!("the API servers at {} to be Ready", target.kubernetes);
        (Step::ApiServer, Some(what))
    } else if !controllers_done {
        let what = format!(
            "the controller-manager and the scheduler at {} to be Ready",
            target.kubernetes
        );
        (Step::Controllers, Some(what))
    } else {
        (Step::Done, None)
    };
    Plan {
        target,
        etcd_version,
        api_server,
        controllers,
        step,
        waiting_for,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(version: &str) -> Release {
        Release::of(version).unwrap()
    }

    #[test]
    fn a_new_control_plane_starts_its_etcd_then_its_api_servers_then_the_rest() {
        let first = plan(release("1.34"), &Facts::default());
        assert_eq!((first.step, first.etcd_version.as_str()), (Step::Etcd, "3.6.16"));
        assert_eq!(
            (first.api_server.clone(), first.controllers.clone()),
            (None, None),
            "nothing before etcd"
        );
        let mut facts = Facts::etcd_ready("3.6.16");
        let second = plan(release("1.34"), &facts);
        assert_eq!(second.step, Step::ApiServer);
        assert_eq!(second.api_server, Some(release("1.34")));
        assert_eq!(second.controllers, None, "the controllers wait for the API servers");
        facts.deployed(Component::ApiServer, "1.34.4", true);
        let third = plan(release("1.34"), &facts);
        assert_eq!(
            (third.step, third.controllers.clone()),
            (Step::Controllers, Some(release("1.34")))
        );
        facts.deployed(Component::ControllerManager, "1.34.4", true);
        facts.deployed(Component::Scheduler, "1.34.4", true);
        assert_eq!(plan(release("1.34"), &facts).step, Step::Done);
    }

    #[test]
    fn an_upgrade_moves_etcd_first_then_the_api_servers_then_the_rest_and_never_lowers_etcd() {
        let mut facts = Facts::etcd_ready("3.5.35");
        for component in Component::ALL {
            facts.deployed(component, "1.33.13", true);
        }
        let moving_etcd = plan(release("1.34"), &facts);
        assert_eq!(
            (moving_etcd.step, moving_etcd.etcd_version.as_str()),
            (Step::Etcd, "3.6.16")
        );
        assert_eq!(
            moving_etcd.api_server,
            Some(release("1.33.13")),
            "the API servers keep their version"
        );
        facts.etcd_version = Some("3.6.16".into());
        facts.etcd_spec_version = Some("3.6.16".into());
        let moving_api = plan(release("1.34"), &facts);
        assert_eq!(
            (moving_api.step, moving_api.api_server.clone()),
            (Step::ApiServer, Some(release("1.34")))
        );
        assert_eq!(moving_api.controllers, Some(release("1.33.13")), "the controllers wait");
        // An API server rollout that is not done keeps the controllers where they are.
        facts.deployed(Component::ApiServer, "1.34.4", false);
        assert_eq!(plan(release("1.34"), &facts).controllers, Some(release("1.33.13")));
        // A table that pairs an older etcd never moves a newer one back.
        assert_eq!(
            plan(release("1.33"), &Facts::etcd_ready("3.6.16")).etcd_version,
            "3.6.16"
        );
    }

    #[test]
    fn an_etcd_that_is_not_ready_holds_the_rollout_and_says_so() {
        let mut facts = Facts::etcd_ready("3.6.16");
        facts.etcd_ready = false;
        facts.deployed(Component::ApiServer, "1.34.4", true);
        let held = plan(release("1.34"), &facts);
        assert_eq!(held.step, Step::Etcd);
        assert_eq!(
            held.api_server,
            Some(release("1.34.4")),
            "a running API server is left running"
        );
        assert_eq!(held.waiting_for.as_deref(), Some("etcd 3.6.16 to be Ready"));
    }
}
