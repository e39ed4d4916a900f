//! The Kustomize components as the real `kubectl kustomize` renders them for
//! two apps of one namespace (`fixtures/app-a`, `fixtures/app-b`: each a
//! Deployment with its own `prometheus.io/*` annotations and a 120s grace
//! period and a `courier.yaml` with its own bucket, using
//! `deploy/kustomize/base` and `podmonitor`), alone and both in one
//! kustomization (`fixtures/two-apps`): what the app set comes out
//! unchanged, no object or referenced name is the same for both apps, and
//! each courier mounts a config of its own render that passes `courier
//! check`. A render the component cannot apply fails.

use super::manifests::{self, CourierPod, at, seq, str_at};
use super::sidecar;
use serde_norway::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

const APPS: [&str; 2] = ["app-a", "app-b"];

fn fixture(app: &str) -> PathBuf {
    manifests::root()
        .join("tests/suite/deploy/fixtures")
        .join(app)
}

/// `COURIER_KUBECTL`, else the kubectl that the test support installs into
/// `./.venv` with the other checkers (`tests/py/requirements.txt`). Missing,
/// it fails the test: CI must not pass without rendering.
fn kubectl() -> PathBuf {
    if let Some(k) = std::env::var_os("COURIER_KUBECTL") {
        return k.into();
    }
    let venv_python = support::python::python();
    let k = venv_python.with_file_name("kubectl");
    assert!(
        k.exists(),
        "{} is missing: install CI's tools with `.venv/bin/python -m pip install -r .ci/requirements.txt` (.ci/run does)",
        k.display()
    );
    k
}

/// `kubectl kustomize` of a fixture: its documents, or what it printed on
/// stderr when it failed.
fn try_render(app: &str) -> Result<Vec<Value>, String> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(fixture(app))
        .output()
        .expect("run kubectl kustomize");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(manifests::parse_yaml(
        &String::from_utf8_lossy(&out.stdout),
        app,
    ))
}

fn render(app: &str) -> Vec<Value> {
    try_render(app).unwrap_or_else(|e| panic!("kubectl kustomize {app} failed:\n{e}"))
}

fn kind(v: &Value) -> &str {
    str_at(v, &["kind"]).unwrap_or("")
}

fn deployment<'a>(app: &str, docs: &'a [Value]) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == "Deployment")
        .unwrap_or_else(|| panic!("{app}: no Deployment rendered"))
}

#[test]
fn the_component_keeps_the_apps_annotations_and_grace() {
    for app in APPS {
        let own = manifests::parse_all(&fixture(app).join("deployment.yaml"));
        let docs = render(app);
        let rendered = deployment(app, &docs);
        for keys in [
            &["spec", "template", "metadata", "annotations"][..],
            &["spec", "template", "spec", "terminationGracePeriodSeconds"],
        ] {
            let want = at(&own[0], keys);
            assert!(!want.is_null(), "{app}'s fixture sets no {keys:?}");
            assert_eq!(at(rendered, keys), want, "{app}: {keys:?} was changed");
        }
    }
}

/// Every (kind, name) a render creates or its pods refer to (ConfigMaps and
/// Secrets by volume, env and envFrom), and the namespaces it creates them in.
fn names(docs: &[Value]) -> (BTreeSet<(String, String)>, BTreeSet<String>) {
    fn refs(v: &Value, out: &mut BTreeSet<(String, String)>) {
        for (k, v) in v.as_mapping().into_iter().flatten() {
            let name = match k.as_str() {
                Some("configMap" | "configMapKeyRef" | "configMapRef") => {
                    str_at(v, &["name"]).map(|n| ("ConfigMap", n))
                }
                Some("secretKeyRef" | "secretRef") => str_at(v, &["name"]).map(|n| ("Secret", n)),
                Some("secret") => str_at(v, &["secretName"]).map(|n| ("Secret", n)),
                _ => None,
            };
            out.extend(name.map(|(k, n)| (k.to_string(), n.to_string())));
            refs(v, out);
        }
        for v in v.as_sequence().into_iter().flatten() {
            refs(v, out);
        }
    }
    let mut named = BTreeSet::new();
    let mut namespaces = BTreeSet::new();
    for d in docs {
        let name = str_at(d, &["metadata", "name"]).unwrap_or("");
        named.insert((kind(d).to_string(), name.to_string()));
        namespaces.insert(
            str_at(d, &["metadata", "namespace"])
                .unwrap_or("")
                .to_string(),
        );
        refs(at(d, &["spec", "template", "spec"]), &mut named);
    }
    (named, namespaces)
}

#[test]
fn two_apps_in_one_namespace_render_no_clashing_names() {
    let [(a, ns_a), (b, ns_b)] = APPS.map(|app| names(&render(app)));
    assert!(
        ns_a.len() == 1 && ns_a == ns_b,
        "the fixtures are not in one namespace: {ns_a:?} {ns_b:?}"
    );
    for kind in ["ConfigMap", "Secret", "PodMonitor"] {
        assert!(
            a.iter().any(|(k, _)| k == kind),
            "app-a renders or refers to no {kind}: {a:?}"
        );
    }
    let clash: Vec<_> = a.intersection(&b).collect();
    assert!(clash.is_empty(), "both apps use {clash:?}");
}

/// The courier pod of `workload`, with the ConfigMaps of its render.
fn courier_pod(app: &str, workload: &Value, docs: &[Value]) -> CourierPod {
    let container = seq(workload, &["spec", "template", "spec", "initContainers"])
        .iter()
        .find(|c| manifests::is_courier(c))
        .unwrap_or_else(|| panic!("{app}: no courier init container"))
        .clone();
    let config_maps = docs
        .iter()
        .filter(|d| kind(d) == "ConfigMap")
        .map(|cm| {
            let name = str_at(cm, &["metadata", "name"]).unwrap_or("");
            (name.to_string(), manifests::config_map_data(cm))
        })
        .collect();
    CourierPod {
        name: format!("{app} rendered"),
        file: fixture(app),
        workload: workload.clone(),
        container,
        in_init_containers: true,
        config_maps,
    }
}

#[tokio::test]
async fn each_apps_sidecar_mounts_a_config_of_its_own_render() {
    let image = manifests::image();
    for app in APPS {
        let docs = render(app);
        let pod = courier_pod(app, deployment(app, &docs), &docs);
        // config_text() inside: a read-only directory mount of a ConfigMap
        // volume whose ConfigMap this render holds, with the config's key.
        if let Err(e) = sidecar::check(&pod, &image).await {
            panic!("{app}: {e}");
        }
    }
}

/// Two apps in one kustomization (`fixtures/two-apps` lists both apps'
/// folders): two Deployments, each with its own courier sidecar, which
/// mounts `<app>-courier-config` holding that app's own bucket (from its
/// `courier.yaml`), reads `<app>-courier-admin-token`, and passes
/// `courier check`.
#[tokio::test]
async fn two_apps_in_one_kustomization_get_two_sidecars_with_their_own_names_and_buckets() {
    let image = manifests::image();
    let docs = render("two-apps");
    let deployments: Vec<&Value> = docs.iter().filter(|d| kind(d) == "Deployment").collect();
    let names: Vec<&str> = deployments
        .iter()
        .filter_map(|d| str_at(d, &["metadata", "name"]))
        .collect();
    assert_eq!(names, APPS, "the Deployments rendered");
    for (app, workload) in APPS.iter().zip(deployments) {
        let pod = courier_pod(app, workload, &docs);
        let spec = at(workload, &["spec", "template", "spec"]);
        let volume = seq(spec, &["volumes"])
            .iter()
            .find(|v| str_at(v, &["name"]) == Some("courier-config"))
            .and_then(|v| str_at(v, &["configMap", "name"]))
            .map(String::from);
        let config = format!("{app}-courier-config");
        assert_eq!(volume.as_deref(), Some(config.as_str()), "{app}'s mount");
        let token = seq(&pod.container, &["env"])
            .iter()
            .find(|e| str_at(e, &["name"]) == Some("COURIER_ADMIN_TOKEN"))
            .and_then(|e| str_at(e, &["valueFrom", "secretKeyRef", "name"]))
            .map(String::from);
        let secret = format!("{app}-courier-admin-token");
        assert_eq!(token.as_deref(), Some(secret.as_str()), "{app}'s token");
        let text = pod
            .config_maps
            .get(&config)
            .and_then(|d| d.get("courier.yaml"))
            .unwrap_or_else(|| panic!("no ConfigMap {config} with courier.yaml"));
        for prefix in ["dead-letters", "handoff"] {
            let url = format!("url: s3://{app}-courier/{prefix}");
            assert!(text.contains(&url), "{config} lacks {url}:\n{text}");
        }
        if let Err(e) = sidecar::check(&pod, &image).await {
            panic!("{app} in two-apps: {e}");
        }
    }
}

/// A render that asks for courier where the component cannot put it
/// fails, naming why, instead of leaving a workload without courier or
/// mixing two apps: two Deployments in the kustomization that includes
/// the component, a StatefulSet (no Deployment), no `courier-config`.
#[test]
fn a_render_the_component_cannot_apply_fails_naming_why() {
    for (app, why) in [
        (
            "two-deployments",
            "multiple matches for selector Deployment",
        ),
        ("no-deployment", "nothing selected by Deployment"),
        ("no-config", "nothing selected by ConfigMap"),
    ] {
        match try_render(app) {
            Ok(docs) => panic!("{app} rendered {} documents", docs.len()),
            Err(e) => assert!(e.contains(why), "{app}: {e}"),
        }
    }
}

/// Each app's PodMonitor selects its own pods and not the other app's, or
/// the other app's courier is scraped twice.
#[test]
fn each_apps_pod_monitor_selects_only_its_own_pods() {
    let renders = APPS.map(render);
    for (app, docs) in APPS.iter().zip(&renders) {
        let monitor = docs
            .iter()
            .find(|d| kind(d) == "PodMonitor")
            .unwrap_or_else(|| panic!("{app}: no PodMonitor rendered"));
        let selector = at(monitor, &["spec", "selector", "matchLabels"])
            .as_mapping()
            .unwrap_or_else(|| panic!("{app}: the PodMonitor has no matchLabels"));
        for (other, other_docs) in APPS.iter().zip(&renders) {
            let labels = at(
                deployment(other, other_docs),
                &["spec", "template", "metadata", "labels"],
            );
            let selects = selector.iter().all(|(k, v)| labels.get(k) == Some(v));
            assert_eq!(
                selects,
                app == other,
                "{app}'s PodMonitor selects {other}'s pods: {selects}"
            );
        }
    }
}
