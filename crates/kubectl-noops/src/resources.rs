//! The kinds the plugin knows, named as kubectl names them (plural, singular or short name,
//! any case, with or without the group), and the API resource of each.

use std::fmt;

use anyhow::bail;
use kube::api::ApiResource;
use noops_api::{
    EtcdBackup, EtcdCluster, KubernetesCluster, KubernetesControlPlane, Machine, MachineDeployment, MachineSet,
    MaintPage, PostgreSQL, PostgresBackup,
};

/// The kinds the plugin reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    KubernetesCluster,
    KubernetesControlPlane,
    EtcdCluster,
    EtcdBackup,
    PostgreSQL,
    PostgresBackup,
    MaintPage,
    MachineDeployment,
    MachineSet,
    Machine,
}

impl Kind {
    /// Every kind, a cluster's parts after it: the order `get` lists them in.
    pub const ALL: [Kind; 10] = [
        Kind::KubernetesCluster,
        Kind::KubernetesControlPlane,
        Kind::EtcdCluster,
        Kind::EtcdBackup,
        Kind::PostgreSQL,
        Kind::PostgresBackup,
        Kind::MaintPage,
        Kind::MachineDeployment,
        Kind::MachineSet,
        Kind::Machine,
    ];

    pub fn resource(self) -> ApiResource {
        match self {
            Kind::KubernetesCluster => ApiResource::erase::<KubernetesCluster>(&()),
            Kind::KubernetesControlPlane => ApiResource::erase::<KubernetesControlPlane>(&()),
            Kind::EtcdCluster => ApiResource::erase::<EtcdCluster>(&()),
            Kind::EtcdBackup => ApiResource::erase::<EtcdBackup>(&()),
            Kind::PostgreSQL => ApiResource::erase::<PostgreSQL>(&()),
            Kind::PostgresBackup => ApiResource::erase::<PostgresBackup>(&()),
            Kind::MaintPage => ApiResource::erase::<MaintPage>(&()),
            Kind::MachineDeployment => ApiResource::erase::<MachineDeployment>(&()),
            Kind::MachineSet => ApiResource::erase::<MachineSet>(&()),
            Kind::Machine => ApiResource::erase::<Machine>(&()),
        }
    }

    /// The short name of its CRD (EtcdBackup's is its singular name).
    pub fn short_name(self) -> &'static str {
        match self {
            Kind::KubernetesCluster => "kc",
            Kind::KubernetesControlPlane => "kcp",
            Kind::EtcdCluster => "etcd",
            Kind::EtcdBackup => "etcdbackup",
            Kind::PostgreSQL => "pg",
            Kind::PostgresBackup => "pgbackup",
            Kind::MaintPage => "mp",
            Kind::MachineDeployment => "md",
            Kind::MachineSet => "ms",
            Kind::Machine => "ma",
        }
    }

    /// The kind named `text` (plural, singular or short name, any case, any group suffix).
    pub fn named(text: &str) -> Option<Kind> {
        let lower = text.to_lowercase();
        let word = lower.split('.').next().unwrap_or_default();
        Kind::ALL.into_iter().find(|kind| {
            let resource = kind.resource();
            word == resource.kind.to_lowercase() || word == resource.plural || word == kind.short_name()
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// `kind/name` as kubectl takes it.
pub fn parse_resource(text: &str) -> anyhow::Result<(Kind, String)> {
    let Some((kind, name)) = text.split_once('/').filter(|(_, n)| !n.is_empty()) else {
        bail!("name a resource as <kind>/<name>, such as etcdcluster/main or pg/shop");
    };
    let Some(known) = Kind::named(kind) else {
        bail!("kubectl noops knows {}, not {kind:?}", known_kinds());
    };
    Ok((known, name.to_string()))
}

/// Every kind in words, with its short name: `kubernetescluster (kc), …, and machine (ma)`.
fn known_kinds() -> String {
    let names: Vec<String> = Kind::ALL
        .iter()
        .map(|kind| {
            let singular = kind.resource().kind.to_lowercase();
            if singular == kind.short_name() {
                singular
            } else {
                format!("{singular} ({})", kind.short_name())
            }
        })
        .collect();
    match names.split_last() {
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_named_as_kubectl_names_them() {
        for (text, kind) in [
            ("etcdcluster/main", Kind::EtcdCluster),
            ("etcd/main", Kind::EtcdCluster),
            ("EtcdClusters.noops.dev/main", Kind::EtcdCluster),
            ("pg/main", Kind::PostgreSQL),
            ("postgresql/main", Kind::PostgreSQL),
            ("mp/main", Kind::MaintPage),
            ("kc/main", Kind::KubernetesCluster),
            ("kcp/main", Kind::KubernetesControlPlane),
            ("etcdbackup/main", Kind::EtcdBackup),
            ("etcdbackups/main", Kind::EtcdBackup),
            ("pgbackup/main", Kind::PostgresBackup),
            ("postgresbackups.noops.dev/main", Kind::PostgresBackup),
            ("ma/main", Kind::Machine),
            ("Machine/main", Kind::Machine),
            ("ms/main", Kind::MachineSet),
            ("machinesets/main", Kind::MachineSet),
            ("md/main", Kind::MachineDeployment),
            ("machinedeployment/main", Kind::MachineDeployment),
        ] {
            assert_eq!(parse_resource(text).unwrap(), (kind, "main".to_string()), "{text}");
        }
        assert!(parse_resource("main").is_err());
        assert!(parse_resource("etcd/").is_err());
    }

    #[test]
    fn an_unknown_kind_is_refused_with_every_kind_named() {
        let error = parse_resource("deployment/main").unwrap_err().to_string();
        for kind in Kind::ALL {
            let singular = kind.resource().kind.to_lowercase();
            assert!(error.contains(&singular), "{singular} not in {error}");
            assert!(
                error.contains(kind.short_name()),
                "{} not in {error}",
                kind.short_name()
            );
        }
        assert!(error.contains("etcdbackup,"), "no short name twice: {error}");
        assert!(error.ends_with("and machine (ma), not \"deployment\""), "{error}");
    }

    #[test]
    fn every_kind_has_its_crds_short_name() {
        for crd in noops_api::crds() {
            let kind = Kind::named(&crd.spec.names.kind).unwrap();
            let shorts = crd.spec.names.short_names.unwrap_or_default();
            assert!(shorts.iter().any(|s| s == kind.short_name()), "{kind}: {shorts:?}");
        }
        assert_eq!(Kind::ALL.len(), noops_api::crds().len());
    }
}
