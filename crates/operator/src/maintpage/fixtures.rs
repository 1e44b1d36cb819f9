//! The MaintPage every test of this controller starts from, changed only where a test says so:
//! `fixtures::maintpage().enabled(true).build()`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use noops_api::maintpage::{AppSpec, MaintPage, MaintPageSpec, MaintPageStatus, MaintenanceSpec, ServiceSpec, Side};

use super::switch::Plan;
use crate::core::fixtures::owner_reference;

/// A MaintPage under construction.
pub struct MaintPageFixture(MaintPage);

/// MaintPage `shop` in namespace `web` (uid `uid-1`, generation 1): app `shop` (image `app:1`,
/// port 5678, 2 replicas), maintenance page `page:1` (port 8080, 1 replica, disabled), a
/// ClusterIP Service on port 80.
pub fn maintpage() -> MaintPageFixture {
    let mut mp = MaintPage::new(
        "shop",
        MaintPageSpec {
            app: AppSpec {
                name: "shop".into(),
                image: "app:1".into(),
                args: Some(vec!["-text=hi".into()]),
                port: 5678,
                replicas: 2,
            },
            maintenance: MaintenanceSpec {
                image: "page:1".into(),
                args: None,
                port: 8080,
                replicas: 1,
                enabled: false,
            },
            service: ServiceSpec::default(),
            paused: false,
        },
    );
    mp.metadata.namespace = Some("web".into());
    mp.metadata.uid = Some("uid-1".into());
    mp.metadata.generation = Some(1);
    MaintPageFixture(mp)
}

impl MaintPageFixture {
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.0.spec.maintenance.enabled = enabled;
        self
    }

    pub fn app_replicas(mut self, n: i32) -> Self {
        self.0.spec.app.replicas = n;
        self
    }

    pub fn app_image(mut self, image: &str) -> Self {
        self.0.spec.app.image = image.into();
        self
    }

    pub fn generation(mut self, g: i64) -> Self {
        self.0.metadata.generation = Some(g);
        self
    }

    pub fn status(mut self, status: MaintPageStatus) -> Self {
        self.0.status = Some(status);
        self
    }

    pub fn build(self) -> MaintPage {
        self.0
    }
}

/// The controller reference of the fixture's children.
pub fn owner() -> OwnerReference {
    owner_reference("MaintPage", "shop", "uid-1")
}

/// A plan that publishes `publish` and runs `maintenance_replicas` maintenance pods, with no
/// switch, wait or drain.
pub fn plan(publish: Side, maintenance_replicas: i32) -> Plan {
    Plan {
        publish,
        published: Some(publish),
        first_publish: false,
        switched: false,
        switched_at: None,
        waiting_for: None,
        started_waiting: false,
        maintenance_replicas,
        requeue_after: None,
    }
}
