//! What a MaintPage reconcile sees: its children as they are, the facts the switch plan needs
//! (which side is published, whether each side has rolled out, which side the switch waits
//! for), and whether the pods of a side cannot start.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use noops_api::maintpage::{MaintPage, Side};

use super::context::Context;
use super::desired::{OWNER_LABEL, selector};
use super::switch::Facts;
use crate::core::Result;
use crate::core::rollout::deployment_rolled_out;
use crate::core::stuck::{Stuck, stuck};

/// The live children of a MaintPage (any of them may not exist yet).
#[derive(Debug, Clone, Default)]
pub struct Live {
    pub app: Option<Deployment>,
    pub maintenance: Option<Deployment>,
    pub service: Option<Service>,
}

/// Everything one reconcile knows about the cluster.
#[derive(Debug, Clone)]
pub struct Observation {
    pub live: Live,
    pub facts: Facts,
    /// Why the app's pods cannot start, if they cannot.
    pub app_stuck: Option<Stuck>,
    /// Why the maintenance page's pods cannot start, if they cannot.
    pub maintenance_stuck: Option<Stuck>,
    /// When a pod that waits for a node would count as stuck, if one does (look again then).
    pub recheck_after: Option<std::time::Duration>,
}

/// Why a child the caches do not hold is read: one of that name that is not ours is found, not
/// made over.
const NOT_OURS: &str = "not-ours-before-create";

/// Reads the children from the watch caches and derives the facts. The caches hold only objects
/// labelled as ours, so a child missing there is looked up directly: an object of that name
/// that is not ours must be found, not overwritten.
pub async fn observe(mp: &MaintPage, namespace: &str, ctx: &Context, now: jiff::Timestamp) -> Result<Observation> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let cached_deployment = |name: &str| {
        ctx.deployments
            .get(&ObjectRef::new(name).within(namespace))
            .map(|d| (*d).clone())
    };
    let app = match cached_deployment(&mp.spec.app.name) {
        Some(d) => Some(d),
        None => crate::core::confirm::get(&deployments, &mp.spec.app.name, NOT_OURS).await?,
    };
    let maintenance = match cached_deployment(&mp.spec.maintenance_name()) {
        Some(d) => Some(d),
        None => crate::core::confirm::get(&deployments, &mp.spec.maintenance_name(), NOT_OURS).await?,
    };
    let service = match ctx.services.get(&ObjectRef::new(&mp.spec.app.name).within(namespace)) {
        Some(s) => Some((*s).clone()),
        None => crate::core::confirm::get(&services, &mp.spec.app.name, NOT_OURS).await?,
    };
    let live = Live {
        app,
        maintenance,
        service,
    };
    let side_pods = |side: Side| {
        let wanted = selector(mp, side);
        let mp_name = mp.metadata.name.as_deref();
        let pods: Vec<std::sync::Arc<Pod>> = ctx
            .pods
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .filter(|p| {
                let labels = p.metadata.labels.as_ref();
                labels.and_then(|l| l.get(OWNER_LABEL)).map(String::as_str) == mp_name
                    && wanted.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
            })
            .collect();
        pods
    };
    let (app_pods, maintenance_pods) = (side_pods(Side::App), side_pods(Side::Maintenance));
    let all_pods = app_pods.iter().chain(&maintenance_pods).map(|p| p.as_ref());
    Ok(Observation {
        facts: facts(mp, &live),
        live,
        app_stuck: stuck(app_pods.iter().map(|p| p.as_ref()), now),
        maintenance_stuck: stuck(maintenance_pods.iter().map(|p| p.as_ref()), now),
        recheck_after: crate::core::stuck::recheck_after(all_pods, now),
    })
}

/// The facts the switch plan needs, from the status and the live children. Pure.
pub fn facts(mp: &MaintPage, live: &Live) -> Facts {
    let previous = mp.status.clone().unwrap_or_default();
    Facts {
        // From the status only: the live selector may point at a side that is not Ready yet
        // (a new MaintPage's), which does not make it published.
        published: previous.published,
        switched_at: previous.switched_at.as_ref().map(|t| t.0),
        app_ready: deployment_rolled_out(live.app.as_ref(), mp.spec.app.replicas),
        maintenance_ready: deployment_rolled_out(live.maintenance.as_ref(), mp.spec.maintenance.replicas),
        waiting_for: previous.waiting_for,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::deployment;
    use crate::maintpage::{desired, fixtures, switch};
    use noops_api::MaintPageStatus;

    #[test]
    fn the_published_side_comes_from_the_status_not_from_the_live_selector() {
        let mp = fixtures::maintpage().build();
        let plan = switch::plan(&mp.spec, &Facts::default(), jiff::Timestamp::UNIX_EPOCH);
        let children = desired::build(&mp, &plan, &Default::default(), &fixtures::owner());
        let live = Live {
            service: Some(children.service.clone()),
            ..Default::default()
        };
        assert_eq!(
            facts(&mp, &live).published,
            None,
            "a Service selecting a side that was never Ready publishes nothing"
        );
        let recorded = fixtures::maintpage()
            .status(MaintPageStatus {
                published: Some(Side::Maintenance),
                ..Default::default()
            })
            .build();
        assert_eq!(facts(&recorded, &live).published, Some(Side::Maintenance));
    }

    #[test]
    fn each_side_is_ready_once_rolled_out() {
        let mp = fixtures::maintpage().build();
        let live = Live {
            app: Some(deployment("shop").replicas(2).ready(2).build()),
            maintenance: Some(deployment("shop-maintenance").replicas(1).build()),
            service: None,
        };
        let f = facts(&mp, &live);
        assert!(f.app_ready && !f.maintenance_ready);
    }

    #[test]
    fn a_wait_already_announced_is_read_from_the_status() {
        let waiting = fixtures::maintpage()
            .enabled(true)
            .status(MaintPageStatus {
                published: Some(Side::App),
                waiting_for: Some(Side::Maintenance),
                ..Default::default()
            })
            .build();
        assert_eq!(facts(&waiting, &Live::default()).waiting_for, Some(Side::Maintenance));
        assert_eq!(
            facts(&fixtures::maintpage().build(), &Live::default()).waiting_for,
            None
        );
    }
}
