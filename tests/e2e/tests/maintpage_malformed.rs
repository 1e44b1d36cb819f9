//! One malformed MaintPage must not stop the operator's watch. The CRD schema is loosened for a
//! moment to store an object the operator cannot read, so no other test may run meanwhile: it
//! is ignored by the pool of `make e2e` and run after it, alone, with the node-fault tests
//! (`hack/e2e-run.sh --ignored`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use noops_api::MaintPage;
use noops_api::maintpage::Side;
use noops_e2e::*;

#[tokio::test]
#[ignore = "loosens the MaintPage schema for a moment: `make e2e` runs it alone, after the rest"]
async fn a_malformed_maintpage_gets_an_event_and_the_others_are_still_reconciled() {
    install_crds();
    let ns = TestNamespace::new("mp-malformed").await;
    let mut operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    ns.apply(
        r#"
apiVersion: noops.dev/v1alpha1
kind: MaintPage
metadata: { name: good }
spec:
  app: { name: good, image: hashicorp/http-echo, args: ["-text=app", "-listen=:8080"] }
  maintenance: { image: hashicorp/http-echo, args: ["-text=page", "-listen=:8080"] }
"#,
    );
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Ready",
            "maintpage/good",
            "--timeout=120s",
        ],
        None,
    );

    // Loosen the schema (a full replace: apply would merge into the old schema), store an object
    // the operator cannot read, and put the schema back.
    let original: serde_json::Value =
        serde_json::from_str(&kubectl_ok(&["get", "crd", "maintpages.noops.dev", "-o", "json"], None)).unwrap();
    let mut loose = original.clone();
    loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] =
        serde_json::json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
    kubectl_ok(&["replace", "-f", "-"], Some(&loose.to_string()));
    let bad = "apiVersion: noops.dev/v1alpha1\nkind: MaintPage\nmetadata: { name: bad }\nspec: { app: { name: bad, port: eighty } }\n";
    wait_until(
        "the loosened schema to take effect",
        Duration::from_secs(30),
        || async {
            kubectl(&["create", "-n", &ns.name, "-f", "-"], Some(bad))
                .status
                .success()
        },
    )
    .await;
    let mut restored: serde_json::Value =
        serde_json::from_str(&kubectl_ok(&["get", "crd", "maintpages.noops.dev", "-o", "json"], None)).unwrap();
    restored["spec"] = original["spec"].clone();
    kubectl_ok(&["replace", "-f", "-"], Some(&restored.to_string()));

    // The operator reports the bad object and goes on reconciling the good one.
    let events: Api<Event> = ns.api();
    wait_until(
        "a Malformed event for the bad object",
        Duration::from_secs(30),
        || async {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("Malformed") && e.involved_object.name.as_deref() == Some("bad"))
        },
    )
    .await;
    let api: Api<MaintPage> = Api::namespaced(ns.client.clone(), &ns.name);
    let patch = serde_json::json!({ "spec": { "maintenance": { "enabled": true } } });
    api.patch("good", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_until("the good MaintPage switched", Duration::from_secs(60), || async {
        // Listing goes through the typed API: the bad object is skipped by reading only `good`.
        api.get("good")
            .await
            .ok()
            .and_then(|mp| mp.status)
            .is_some_and(|s| s.published == Some(Side::Maintenance))
    })
    .await;
    assert!(
        operator.running(),
        "the operator is still running:\n{}",
        operator.log_text()
    );
    kubectl_ok(&["delete", "-n", &ns.name, "maintpage/bad"], None);
}
