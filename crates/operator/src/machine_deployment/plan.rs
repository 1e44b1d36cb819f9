//! What a MachineDeployment does next, as a Deployment does with ReplicaSets: the MachineSet of
//! the current template grows by at most `maxSurge` above `replicas`, and older sets shrink only
//! as far as `maxUnavailable` allows below it, counting only machines that are available. So
//! with the defaults (surge 1, unavailable 0) a new machine is Running before an old one goes,
//! and a new machine that never becomes ready stops the rollout where it is. Pure: every number
//! is read back from the sets as they are.
//!
//! A set's `replicas` and its status move apart: the deployment lowers `replicas`, then the set
//! marks a machine for deletion, then its status says so, then the machine drains and goes, and
//! the cache may show any of these a pass late. So a machine a set has been asked to give up
//! counts as gone for what is available (whether or not its status still shows it) and as
//! still there for what the surge allows (until it is marked), and a machine being deleted is
//! never available. Each is counted once whatever the lag (`plan`'s tests replay the
//! interleavings).

use noops_api::machine_deployment::{MachineDeployment, RollingUpdateSpec, StrategyType};
use noops_api::machine_set::MachineSet;
use serde_json::json;

use crate::core::stamp::hash_of;
use crate::machine_set::health::scaled;

/// The label (on a MachineSet, its selector and its machines) naming the template it was made
/// from, so that the sets of one deployment never select each other's machines.
pub const TEMPLATE_HASH_LABEL: &str = "noops.dev/template-hash";

/// A MachineSet as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetView {
    pub name: String,
    pub template_hash: String,
    /// Replicas asked of it.
    pub replicas: i32,
    /// Machines it has (not being deleted), and how many of them are available, as its status
    /// last said.
    pub machines: i32,
    pub available: i32,
    /// Machines it is deleting (draining): not available, not gone yet.
    pub deleting: i32,
    /// Its status was written for its latest spec.
    pub settled: bool,
    /// When it was made (older sets shrink first).
    pub created: Option<jiff::Timestamp>,
}

impl SetView {
    pub fn of(set: &MachineSet) -> Self {
        let status = set.status.clone().unwrap_or_default();
        Self {
            name: set.metadata.name.clone().unwrap_or_default(),
            template_hash: set
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(TEMPLATE_HASH_LABEL).cloned())
                .unwrap_or_default(),
            replicas: set.spec.replicas,
            machines: status.replicas.unwrap_or(0),
            available: status.available_replicas.unwrap_or(0),
            deleting: status.deleting_replicas.unwrap_or(0),
            settled: set.status.is_some() && status.observed_generation == set.metadata.generation,
            created: set.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// Machines not being deleted that it has or is asked for: what the surge counts. One it
    /// was asked to give up counts until it is marked for deletion.
    fn held(&self) -> i32 {
        self.replicas.max(self.machines)
    }

    /// Machines it keeps once it has `replicas`: one given up counts as gone already.
    fn keeps(&self, replicas: i32) -> i32 {
        self.machines.min(replicas).max(0)
    }

    /// Available machines it keeps once it has `replicas`: a set deletes the machines that are
    /// not ready first, so it gives up available ones only past those.
    fn keeps_available(&self, replicas: i32) -> i32 {
        self.available.min(replicas).max(0)
    }

    /// No machine left, none asked, none still being deleted.
    fn empty(&self) -> bool {
        self.replicas == 0 && self.machines == 0 && self.deleting == 0 && self.settled
    }
}

/// The hash of a deployment's template: a new one is a new MachineSet.
pub fn template_hash(md: &MachineDeployment) -> String {
    let template = serde_json::to_value(&md.spec.template).unwrap_or_default();
    hash_of(&json!(template))[..8].to_string()
}

/// The name of the MachineSet of the current template.
pub fn set_name(md: &MachineDeployment) -> String {
    format!(
        "{}-{}",
        md.metadata.name.as_deref().unwrap_or_default(),
        template_hash(md)
    )
}

/// The replicas each set should have now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeploymentPlan {
    /// The current template's set: its name, and its replicas (None: paused before it exists).
    pub current: Option<(String, i32)>,
    /// Whether the current set must be made.
    pub make_current: bool,
    /// Older sets' replicas, changed or not.
    pub older: Vec<(String, i32)>,
    /// Older sets with no replica and no machine left: removed.
    pub remove: Vec<String>,
    /// Every machine is of the current template, available, and as many as asked.
    pub complete: bool,
}

/// The plan over the deployment's sets.
pub fn plan(md: &MachineDeployment, sets: &[SetView]) -> DeploymentPlan {
    let wanted = md.spec.replicas;
    let hash = template_hash(md);
    let current = sets.iter().find(|s| s.template_hash == hash);
    let mut older: Vec<&SetView> = sets.iter().filter(|s| s.template_hash != hash).collect();
    older.sort_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(&b.name)));
    // Done only once the old machines are gone, not merely draining, and the current set's
    // status speaks of its latest replicas.
    let complete = older.iter().all(|s| s.empty())
        && current.is_some_and(|c| {
            c.settled && c.replicas == wanted && c.machines == wanted && c.available >= wanted && c.deleting == 0
        });
    let remove = older.iter().filter(|s| s.empty()).map(|s| s.name.clone()).collect();
    if md.spec.rollout_paused || md.spec.paused {
        // Only a deployment with one set follows its replicas while its rollout is paused;
        // paused, none changes.
        let current = match (current, sets) {
            (Some(c), [_]) if !md.spec.paused => Some((c.name.clone(), wanted)),
            (Some(c), _) => Some((c.name.clone(), c.replicas)),
            (None, _) => None,
        };
        return DeploymentPlan {
            current,
            older: older.iter().map(|s| (s.name.clone(), s.replicas)).collect(),
            complete,
            ..Default::default()
        };
    }
    let name = current.map_or_else(|| set_name(md), |c| c.name.clone());
    let current_replicas = current.map_or(0, |c| c.replicas);
    let (current_target, older_targets) = match md.spec.strategy.type_ {
        StrategyType::OnDelete => {
            // Old machines go only when someone deletes them; the new set takes their place.
            let kept: Vec<(String, i32)> = older
                .iter()
                .map(|s| (s.name.clone(), s.machines.min(s.replicas)))
                .collect();
            let old_total: i32 = kept.iter().map(|(_, r)| r).sum();
            ((wanted - old_total).max(0), kept)
        }
        StrategyType::RollingUpdate => {
            let rolling = md.spec.strategy.rolling_update.clone().unwrap_or_default();
            rolling_targets(&rolling, wanted, current, current_replicas, &older)
        }
    };
    DeploymentPlan {
        current: Some((name, current_target)),
        make_current: current.is_none(),
        older: older_targets,
        remove,
        complete,
    }
}

/// A rolling update's targets: the current set's and the older sets' replicas.
fn rolling_targets(
    rolling: &RollingUpdateSpec,
    wanted: i32,
    current: Option<&SetView>,
    current_replicas: i32,
    older: &[&SetView],
) -> (i32, Vec<(String, i32)>) {
    let surge = scaled(&rolling.max_surge, wanted, true);
    let mut unavailable = scaled(&rolling.max_unavailable, wanted, false);
    if surge == 0 && unavailable == 0 {
        // Percentages that both round to nothing: one may go, or nothing could move.
        unavailable = 1;
    }
    let min_available = wanted - unavailable;
    // Up: at most `wanted + surge` machines not being deleted, in all.
    let held: i32 = older.iter().map(|s| s.held()).sum::<i32>() + current.map_or(current_replicas, SetView::held);
    let current_target = if older.is_empty() {
        wanted
    } else {
        let room = (wanted + surge) - held;
        (current_replicas + room.max(0))
            .min(wanted)
            .max(current_replicas.min(wanted))
    };
    // Down, counting the current set's machines that are not available yet as missing:
    // - `spare`: available machines the sets keep beyond `wanted - unavailable`; each available
    //   machine an older set gives up takes one.
    // - `spare_kept`: the same, counting an older set's machines that are not available as if
    //   they were (Deployment's cleanup of unhealthy replicas): an older set may give those up
    //   first, at no cost, but only while the new machines are available, so that old machines
    //   merely starting again are not thrown away.
    let current_available = current.map_or(0, |c| c.keeps_available(current_target));
    let mut spare =
        older.iter().map(|s| s.keeps_available(s.replicas)).sum::<i32>() + current_available - min_available;
    let mut spare_kept = older.iter().map(|s| s.keeps(s.replicas)).sum::<i32>() + current_available - min_available;
    let mut targets = Vec::new();
    for set in older {
        // Asked for but not made: giving those up costs nothing.
        let mut replicas = set.replicas.min(set.machines.max(0));
        let not_available = set.keeps(replicas) - set.keeps_available(replicas);
        let cut = not_available.min(spare_kept).max(0);
        spare_kept -= cut;
        replicas -= cut;
        let cut = spare.min(spare_kept).min(replicas).max(0);
        spare -= cut;
        spare_kept -= cut;
        replicas -= cut;
        targets.push((set.name.clone(), replicas));
    }
    (current_target, targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(replicas: i32, version: &str, strategy: serde_json::Value) -> MachineDeployment {
        let spec = serde_json::from_value(json!({
            "clusterName": "c", "replicas": replicas,
            "selector": { "matchLabels": { "pool": "p" } },
            "template": { "metadata": { "labels": { "pool": "p" } }, "spec": { "version": version } },
            "strategy": strategy,
        }))
        .unwrap();
        MachineDeployment::new("pool", spec)
    }

    fn set(name: &str, hash: &str, replicas: i32, machines: i32, available: i32, age: i64) -> SetView {
        SetView {
            name: name.into(),
            template_hash: hash.into(),
            replicas,
            machines,
            available,
            deleting: 0,
            settled: true,
            created: Some(jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(1_000_000 - age)),
        }
    }

    /// Runs a rollout to the end, each step making the asked machines and making them available
    /// at once when `healthy`: returns the most machines there ever were and the fewest
    /// available, and whether it completed.
    fn roll(deployment: &MachineDeployment, mut sets: Vec<SetView>, healthy: bool) -> (i32, i32, bool) {
        let (mut most, mut fewest) = (0, i32::MAX);
        for _ in 0..20 {
            let p = plan(deployment, &sets);
            if p.complete {
                return (most, fewest, true);
            }
            if let Some((name, _)) = &p.current
                && !sets.iter().any(|s| &s.name == name)
            {
                sets.push(set(name, &template_hash(deployment), 0, 0, 0, 0));
            }
            for s in sets.iter_mut() {
                let target = if Some(&s.name) == p.current.as_ref().map(|c| &c.0) {
                    p.current.as_ref().map(|c| c.1).unwrap_or(s.replicas)
                } else {
                    p.older
                        .iter()
                        .find(|(n, _)| n == &s.name)
                        .map(|(_, r)| *r)
                        .unwrap_or(s.replicas)
                };
                s.replicas = target;
                s.machines = target;
                let is_current = s.template_hash == template_hash(deployment);
                s.available = if is_current && !healthy { 0 } else { target };
            }
            sets.retain(|s| !p.remove.contains(&s.name));
            most = most.max(sets.iter().map(|s| s.machines).sum());
            fewest = fewest.min(sets.iter().map(|s| s.available).sum());
        }
        (most, fewest, false)
    }

    #[test]
    fn a_rollout_adds_one_machine_before_it_removes_one_and_ends_with_the_new_template() {
        let old = md(3, "1.33", json!({}));
        let new = md(3, "1.34", json!({}));
        let sets = vec![set("pool-old", &template_hash(&old), 3, 3, 3, 100)];
        let (most, fewest, complete) = roll(&new, sets, true);
        assert!(complete);
        assert_eq!(most, 4, "never more than maxSurge (1) above 3");
        assert_eq!(fewest, 3, "never fewer available than asked (maxUnavailable 0)");
    }

    #[test]
    fn a_rollout_whose_new_machines_never_become_ready_removes_no_old_machine() {
        let old = md(3, "1.33", json!({}));
        let new = md(3, "1.34", json!({}));
        let sets = vec![set("pool-old", &template_hash(&old), 3, 3, 3, 100)];
        let (most, fewest, complete) = roll(&new, sets, false);
        assert!(!complete);
        assert_eq!((most, fewest), (4, 3), "one new machine tried, the old ones untouched");
    }

    #[test]
    fn max_unavailable_lets_old_machines_go_first_and_on_delete_waits_for_deletions() {
        let old = md(4, "1.33", json!({}));
        let new = md(
            4,
            "1.34",
            json!({ "rollingUpdate": { "maxSurge": 0, "maxUnavailable": "50%" } }),
        );
        let sets = vec![set("pool-old", &template_hash(&old), 4, 4, 4, 100)];
        let (most, fewest, complete) = roll(&new, sets.clone(), true);
        assert!(complete);
        assert_eq!((most, fewest), (4, 2));
        let on_delete = md(4, "1.34", json!({ "type": "OnDelete" }));
        let p = plan(&on_delete, &sets);
        assert_eq!(p.current.unwrap().1, 0, "nothing new until an old machine is deleted");
        assert_eq!(p.older, vec![("pool-old".to_string(), 4)]);
        let one_deleted = vec![set("pool-old", &template_hash(&old), 4, 3, 3, 100)];
        let p = plan(&on_delete, &one_deleted);
        assert_eq!(p.current.unwrap().1, 1);
        assert_eq!(
            p.older,
            vec![("pool-old".to_string(), 3)],
            "the deleted one is not made again"
        );
    }

    #[test]
    fn an_older_set_that_has_not_shrunk_yet_leaves_no_room_to_grow() {
        let old = md(2, "1.33", json!({}));
        let new = md(2, "1.34", json!({}));
        // The older set was told to keep 1 but still has its 2 machines; the new one has 1.
        let sets = vec![
            set("pool-old", &template_hash(&old), 1, 2, 2, 100),
            set(&set_name(&new), &template_hash(&new), 1, 1, 1, 10),
        ];
        let p = plan(&new, &sets);
        assert_eq!(p.current.unwrap().1, 1, "a third machine would make 4");
    }

    #[test]
    fn a_machine_given_up_but_not_yet_marked_is_not_given_up_again() {
        // The window: the older set was lowered to 2 and still has its 3 machines (it
        // has not marked one yet, or the cache has not seen it); the new set has 1, ready.
        let old = md(3, "1.33", json!({}));
        let new = md(3, "1.34", json!({}));
        let sets = vec![
            set("pool-old", &template_hash(&old), 2, 3, 3, 100),
            set(&set_name(&new), &template_hash(&new), 1, 1, 1, 10),
        ];
        let p = plan(&new, &sets);
        assert_eq!(p.older, vec![("pool-old".to_string(), 2)], "lowered once, not again");
        assert_eq!(p.current.unwrap().1, 1, "no room until the old machine is marked");
        // Marked and draining: not available, not counted by the surge, and the rollout is not
        // done until it is gone.
        let mut draining = set("pool-old", &template_hash(&old), 0, 0, 0, 100);
        draining.deleting = 1;
        let sets = vec![draining, set(&set_name(&new), &template_hash(&new), 3, 3, 3, 10)];
        let p = plan(&new, &sets);
        assert!(!p.complete, "an old machine still drains");
        assert!(p.remove.is_empty(), "its set stays until it is gone");
    }

    #[test]
    fn an_older_set_gives_up_its_broken_machines_first_once_the_new_ones_are_available() {
        let old = md(3, "1.33", json!({}));
        let new = md(3, "1.34", json!({}));
        // One old machine broken: with surge 1 and none unavailable, waiting for it would stall.
        let new_starting = vec![
            set("pool-old", &template_hash(&old), 3, 3, 2, 100),
            set(&set_name(&new), &template_hash(&new), 1, 1, 0, 10),
        ];
        assert_eq!(plan(&new, &new_starting).older[0].1, 3, "not while the new one starts");
        let new_ready = vec![
            set("pool-old", &template_hash(&old), 3, 3, 2, 100),
            set(&set_name(&new), &template_hash(&new), 1, 1, 1, 10),
        ];
        assert_eq!(plan(&new, &new_ready).older[0].1, 2, "the broken one goes, at no cost");
    }

    #[test]
    fn scaling_and_pausing() {
        let d = md(2, "1.34", json!({}));
        let only = vec![set(&set_name(&d), &template_hash(&d), 2, 2, 2, 100)];
        assert!(plan(&d, &only).complete);
        let bigger = md(4, "1.34", json!({}));
        assert_eq!(plan(&bigger, &only).current.unwrap().1, 4, "scaling is not a rollout");
        let mut paused = md(3, "1.35", json!({}));
        paused.spec.rollout_paused = true;
        let p = plan(&paused, &only);
        assert_eq!(p.current, None, "no new set while paused");
        assert_eq!(p.older, vec![(set_name(&d), 2)]);
        let mut paused_scale = md(5, "1.34", json!({}));
        paused_scale.spec.rollout_paused = true;
        assert_eq!(
            plan(&paused_scale, &only).current.unwrap().1,
            5,
            "a single set follows replicas"
        );
        // Paused (not only its rollout), nothing changes: no scaling either.
        let mut stopped = md(5, "1.35", json!({}));
        stopped.spec.paused = true;
        let p = plan(&stopped, &only);
        assert_eq!(p.current, None);
        assert_eq!(p.older, vec![(set_name(&d), 2)]);
        assert!(p.remove.is_empty() && !p.make_current);
        let mut stopped_scale = md(5, "1.34", json!({}));
        stopped_scale.spec.paused = true;
        assert_eq!(plan(&stopped_scale, &only).current.unwrap().1, 2, "not scaled");
    }
}
