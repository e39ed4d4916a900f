//! The Kubernetes manifests of deploy/ against what courier needs (docs/kubernetes.md
//! "Run in Kubernetes"): for every courier container, its config (from the
//! ConfigMap it mounts) passes the real `courier check`; probes reach the
//! admin port on the right paths; the grace period covers `shutdown_grace`
//! (twice with a hand-off);
//! the journal and dead letters land on a writable volume big enough for
//! `journal.max_bytes` while the config is a read-only directory mount; it
//! runs as a native sidecar under Pod Security "restricted"; the token
//! comes from a Secret; Prometheus finds /metrics; the NetworkPolicy admits
//! only Prometheus to the admin port. The Kustomize component, rendered for
//! two apps, is in `deploy/kustomize.rs`. Also the image's `.dockerignore`.
//! Schema validation of the same files is in .ci/deploy-check.

mod kustomize;
mod manifests;
mod sidecar;

use manifests::{CourierPod, at, seq, str_at};
use serde_norway::Value;
use std::path::Path;
use std::time::Duration;

/// Time to commit and close the journal after `shutdown_grace` (and, with
/// `handoff`, after the hand-off, which gets as long again): the grace
/// period must cover them all, or the kubelet's SIGKILL cuts the hand-off
/// or the final sync.
const JOURNAL_CLOSE: Duration = Duration::from_secs(5);

/// The name of courier's admin port, which PodMonitors, scrape jobs and
/// NetworkPolicies select (the app may use the `prometheus.io/*` annotations).
const ADMIN_PORT: &str = "courier-admin";

/// The journal takes up to ~1.7x its pending bytes on disk (intake log
/// segments not yet reclaimed, SQLite WAL; measured in deploy/README.md).
const DISK_PER_PENDING_BYTE: u64 = 2;

/// Runs `check` on every courier container and collects the failures, so
/// one run names every broken manifest.
fn each(check: impl Fn(&CourierPod) -> Result<(), String>) {
    let pods = manifests::courier_pods();
    assert!(!pods.is_empty(), "no courier container under deploy/");
    let failures: Vec<String> = pods
        .iter()
        .filter_map(|p| check(p).err().map(|e| format!("{}: {e}", p.name)))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Effective configs of every courier container, through `courier check`.
async fn effective() -> Vec<(CourierPod, Result<sidecar::Effective, String>)> {
    let image = manifests::image();
    let mut out = Vec::new();
    for pod in manifests::courier_pods() {
        let e = sidecar::check(&pod, &image).await;
        out.push((pod, e));
    }
    assert!(!out.is_empty(), "no courier container under deploy/");
    out
}

fn assert_all(results: Vec<(String, Result<(), String>)>) {
    let failures: Vec<String> = results
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_example_carries_courier() {
    let names: Vec<String> = manifests::courier_pods()
        .into_iter()
        .map(|p| p.name)
        .collect();
    for want in [
        "deploy/plain/deployment.yaml Deployment/shop",
        "deploy/plain/statefulset.yaml StatefulSet/shop",
        "deploy/kustomize/base/sidecar-patch.yaml Deployment/any",
        "deploy/kustomize/example.rendered.yaml Deployment/shop",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} not found in {names:#?}"
        );
    }
}

#[tokio::test]
async fn every_sidecar_config_passes_courier_check() {
    assert_all(
        effective()
            .await
            .into_iter()
            .map(|(p, e)| (p.name, e.map(|_| ())))
            .collect(),
    );
}

#[test]
fn courier_is_a_native_sidecar() {
    each(|p| {
        if !p.in_init_containers {
            return Err("courier is in containers: it must be an initContainer".into());
        }
        match str_at(&p.container, &["restartPolicy"]) {
            Some("Always") => Ok(()),
            other => Err(format!(
                "initContainer restartPolicy is {other:?}, not Always"
            )),
        }
    });
}

/// A probe's port, by name (a port of the container) or number.
fn probe_port(p: &CourierPod, probe: &Value) -> Result<u64, String> {
    let port = at(probe, &["httpGet", "port"]);
    if let Some(n) = port.as_u64() {
        return Ok(n);
    }
    let name = port.as_str().ok_or("httpGet.port is missing")?;
    container_port(&p.container, name).ok_or_else(|| format!("no container port named {name}"))
}

#[tokio::test]
async fn probes_reach_the_admin_port_on_their_paths() {
    let results = effective().await.into_iter().map(|(p, e)| {
        let r = e.and_then(|e| {
            for (probe, path) in [
                ("startupProbe", "/readyz"),
                ("readinessProbe", "/readyz"),
                ("livenessProbe", "/healthz"),
            ] {
                let v = at(&p.container, &[probe]);
                if v.is_null() {
                    return Err(format!("no {probe}"));
                }
                let port = probe_port(&p, v)?;
                if port != u64::from(e.admin_port) {
                    return Err(format!(
                        "{probe} port {port} is not admin_listen's {}",
                        e.admin_port
                    ));
                }
                let got = str_at(v, &["httpGet", "path"]);
                if got != Some(path) {
                    return Err(format!("{probe} path {got:?}, want {path}"));
                }
            }
            Ok(())
        });
        (p.name, r)
    });
    assert_all(results.collect());
}

#[tokio::test]
async fn the_grace_period_covers_shutdown_grace_and_the_journal_close() {
    let results = effective().await.into_iter().map(|(p, e)| {
        let r = e.and_then(|e| {
            let tgps = at(p.pod_spec(), &["terminationGracePeriodSeconds"]);
            // A strategic-merge patch would replace the app's own value.
            if p.is_patch() {
                return if tgps.is_null() {
                    Ok(())
                } else {
                    Err("the patch sets terminationGracePeriodSeconds, replacing the app's".into())
                };
            }
            let tgps = tgps
                .as_u64()
                .ok_or("terminationGracePeriodSeconds is not set")?;
            // Attempts in flight, then with a hand-off as long again to
            // write the pending events to the bucket (docs/object-storage.md "What happens
            // on a rolling deploy").
            let graces = if e.handoff { 2 } else { 1 };
            let need = e.shutdown_grace * graces + JOURNAL_CLOSE;
            if Duration::from_secs(tgps) <= need {
                return Err(format!(
                    "terminationGracePeriodSeconds {tgps} must exceed {graces} x shutdown_grace {:?}{} + {JOURNAL_CLOSE:?}",
                    e.shutdown_grace,
                    if e.handoff { " (handoff)" } else { "" }
                ));
            }
            Ok(())
        });
        (p.name, r)
    });
    assert_all(results.collect());
}

/// A Kubernetes quantity in bytes: `3Gi`, `512Mi`, `1G`, `1000`.
fn quantity(q: &str) -> Option<u64> {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().ok()?.checked_mul(factor);
        }
    }
    q.parse().ok()
}

/// The size of a writable data volume: emptyDir sizeLimit or the claim's request.
fn volume_size(v: &Value) -> Option<u64> {
    [
        at(v, &["emptyDir", "sizeLimit"]),
        at(v, &["spec", "resources", "requests", "storage"]),
    ]
    .into_iter()
    .find_map(|q| q.as_str().and_then(quantity))
}

#[tokio::test]
async fn data_goes_to_a_writable_volume_and_the_config_is_read_only() {
    let image = manifests::image();
    let results = effective().await.into_iter().map(|(p, e)| {
        let r = e.and_then(|e| {
            // config_text() checked the read-only directory mount; again
            // here, so that this test fails on its own.
            sidecar::config_text(&p, &sidecar::config_path(&p, &image))?;
            for (key, dir) in &e.data_dirs {
                let mount = sidecar::mount_for(&p, dir)
                    .ok_or_else(|| format!("{key} {} is on no volume", dir.display()))?;
                let name = str_at(mount, &["name"]).unwrap_or("");
                if at(mount, &["readOnly"]).as_bool() == Some(true) {
                    return Err(format!(
                        "{key} {} is on read-only volume {name}",
                        dir.display()
                    ));
                }
                let vol = sidecar::volume(&p, name).ok_or_else(|| format!("no volume {name}"))?;
                let claim = vol.get("spec").is_some() || vol.get("persistentVolumeClaim").is_some();
                if vol.get("emptyDir").is_none() && !claim {
                    return Err(format!(
                        "{key} is on {name}, neither an emptyDir nor a claim"
                    ));
                }
                if claim && at(p.pod_spec(), &["securityContext", "fsGroup"]).is_null() {
                    return Err(format!(
                        "{name} is a claim: set fsGroup so courier can write it"
                    ));
                }
                if key == "journal.dir" {
                    let size = volume_size(vol).ok_or_else(|| {
                        format!("{name}: set emptyDir.sizeLimit or a storage request")
                    })?;
                    let need = e.journal_max_bytes * DISK_PER_PENDING_BYTE;
                    if size < need {
                        return Err(format!(
                            "{name} holds {size} bytes, journal.max_bytes {} needs {need}",
                            e.journal_max_bytes
                        ));
                    }
                }
            }
            Ok(())
        });
        (p.name, r)
    });
    assert_all(results.collect());
}

/// Pod Security "restricted" for one container, fields falling back to
/// the pod's securityContext where Kubernetes allows, plus a read-only
/// root filesystem.
fn restricted(pod: &Value, c: &Value) -> Result<(), String> {
    let sc = |k: &str| {
        let own = at(c, &["securityContext", k]);
        if own.is_null() {
            at(pod, &["securityContext", k])
        } else {
            own
        }
    };
    let name = str_at(c, &["name"]).unwrap_or("?");
    let fail = |what: &str| Err(format!("container {name}: {what}"));
    if sc("runAsNonRoot").as_bool() != Some(true) {
        return fail("runAsNonRoot is not true");
    }
    if sc("runAsUser").as_u64() == Some(0) {
        return fail("runAsUser is 0");
    }
    if at(c, &["securityContext", "allowPrivilegeEscalation"]).as_bool() != Some(false) {
        return fail("allowPrivilegeEscalation is not false");
    }
    if at(c, &["securityContext", "privileged"]).as_bool() == Some(true) {
        return fail("privileged");
    }
    let caps = |k: &str| -> Vec<&str> {
        seq(c, &["securityContext", "capabilities", k])
            .iter()
            .filter_map(Value::as_str)
            .collect()
    };
    if !caps("drop").contains(&"ALL") {
        return fail("capabilities.drop lacks ALL");
    }
    if caps("add").iter().any(|c| *c != "NET_BIND_SERVICE") {
        return fail("adds capabilities other than NET_BIND_SERVICE");
    }
    if !matches!(
        str_at(sc("seccompProfile"), &["type"]),
        Some("RuntimeDefault" | "Localhost")
    ) {
        return fail("seccompProfile is not RuntimeDefault or Localhost");
    }
    if at(c, &["securityContext", "readOnlyRootFilesystem"]).as_bool() != Some(true) {
        return fail("readOnlyRootFilesystem is not true");
    }
    Ok(())
}

/// Volume types the restricted profile allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

#[test]
fn pods_meet_the_restricted_pod_security_profile() {
    let image = manifests::image();
    let image_uid = image
        .user
        .split(':')
        .next()
        .and_then(|u| u.parse::<u64>().ok());
    each(|p| {
        let pod = p.pod_spec();
        for host in ["hostNetwork", "hostPID", "hostIPC"] {
            if at(pod, &[host]).as_bool() == Some(true) {
                return Err(format!("{host} is true"));
            }
        }
        for v in seq(pod, &["volumes"]) {
            let ok = v.as_mapping().into_iter().flatten().all(|(k, _)| {
                k.as_str()
                    .is_some_and(|k| k == "name" || RESTRICTED_VOLUMES.contains(&k))
            });
            if !ok {
                return Err(format!(
                    "volume {:?} has a type restricted pods cannot use",
                    str_at(v, &["name"])
                ));
            }
        }
        for c in p.containers() {
            restricted(pod, c)?;
        }
        // The image's state folder belongs to its USER: run as that uid.
        let uid = at(&p.container, &["securityContext", "runAsUser"])
            .as_u64()
            .or(at(pod, &["securityContext", "runAsUser"]).as_u64());
        if uid != image_uid {
            return Err(format!(
                "courier runs as {uid:?}, the image's USER is {}",
                image.user
            ));
        }
        Ok(())
    });
}

#[tokio::test]
async fn the_admin_token_comes_from_a_secret() {
    let results = effective().await.into_iter().map(|(p, e)| {
        let r = e.and_then(|e| {
            let var = e.admin_token_env.ok_or("admin_token_env is not set")?;
            let entry = seq(&p.container, &["env"])
                .iter()
                .find(|v| str_at(v, &["name"]) == Some(var.as_str()))
                .ok_or_else(|| format!("{var} is not in the container's env"))?;
            let secret = at(entry, &["valueFrom", "secretKeyRef"]);
            if str_at(secret, &["name"]).is_none() || str_at(secret, &["key"]).is_none() {
                return Err(format!("{var} is not from a secretKeyRef"));
            }
            Ok(())
        });
        (p.name, r)
    });
    assert_all(results.collect());
}

#[tokio::test]
async fn prometheus_finds_metrics_on_the_admin_port() {
    let pods = effective().await;
    let mut results: Vec<(String, Result<(), String>)> = Vec::new();
    for (p, e) in &pods {
        let r = e.as_ref().map_err(String::clone).and_then(|e| {
            if container_port(&p.container, ADMIN_PORT) != Some(u64::from(e.admin_port)) {
                return Err(format!(
                    "no port {ADMIN_PORT} at admin_listen's {}",
                    e.admin_port
                ));
            }
            // The annotations belong to whoever sets them (the plain
            // examples: courier; an app of the component: the app), but
            // must name a port of the pod.
            let ann = |k: &str| str_at(p.template(), &["metadata", "annotations", k]);
            if let Some(port) = ann("prometheus.io/port") {
                let ports: Vec<String> = p
                    .containers()
                    .flat_map(|c| seq(c, &["ports"]))
                    .filter_map(|cp| at(cp, &["containerPort"]).as_u64())
                    .map(|n| n.to_string())
                    .collect();
                if !ports.iter().any(|n| n == port) {
                    return Err(format!("prometheus.io/port {port} is no port of the pod"));
                }
            }
            if p.is_patch() && !at(p.template(), &["metadata", "annotations"]).is_null() {
                return Err("the patch sets pod annotations, replacing the app's".into());
            }
            Ok(())
        });
        results.push((p.name.clone(), r));
    }
    let monitors: Vec<manifests::Doc> = manifests::docs()
        .into_iter()
        .filter(|d| d.kind() == "PodMonitor")
        .collect();
    assert!(
        monitors.len() >= 2,
        "the plain and Kustomize PodMonitors are missing"
    );
    for m in monitors {
        let rel = m.file.strip_prefix(manifests::root()).unwrap_or(&m.file);
        let name = format!("{} PodMonitor", rel.display());
        let r = pod_monitor_matches(&m.value, &pods);
        results.push((name, r));
    }
    assert_all(results);
}

/// The monitor selects at least one courier pod, on a named port of the
/// courier container that is admin_listen's port, at /metrics.
fn pod_monitor_matches(
    m: &Value,
    pods: &[(CourierPod, Result<sidecar::Effective, String>)],
) -> Result<(), String> {
    if str_at(m, &["apiVersion"]) != Some("monitoring.coreos.com/v1") {
        return Err("apiVersion is not monitoring.coreos.com/v1".into());
    }
    let want = at(m, &["spec", "selector", "matchLabels"])
        .as_mapping()
        .ok_or("no spec.selector.matchLabels")?;
    let endpoints = seq(m, &["spec", "podMetricsEndpoints"]);
    if endpoints.is_empty() {
        return Err("no podMetricsEndpoints".into());
    }
    let mut selected = 0;
    for (p, e) in pods {
        let labels = at(p.template(), &["metadata", "labels"]);
        if !want.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            continue;
        }
        selected += 1;
        let e = e.as_ref().map_err(String::clone)?;
        for ep in endpoints {
            let port = str_at(ep, &["port"]).ok_or("an endpoint has no named port")?;
            let number = container_port(&p.container, port);
            if number != Some(u64::from(e.admin_port)) {
                return Err(format!("port {port} of {} is not the admin port", p.name));
            }
            if str_at(ep, &["path"]) != Some("/metrics") {
                return Err("an endpoint's path is not /metrics".into());
            }
        }
    }
    if selected == 0 {
        return Err("its selector matches no pod template with courier".into());
    }
    Ok(())
}

/// The number of a container's port, by name.
fn container_port(container: &Value, name: &str) -> Option<u64> {
    seq(container, &["ports"])
        .iter()
        .find(|cp| str_at(cp, &["name"]) == Some(name))
        .and_then(|cp| at(cp, &["containerPort"]).as_u64())
}

/// Whether an ingress rule admits a container port (`cp`, an entry of a
/// container's `ports`): a rule without ports admits all of them.
fn admits(rule: &Value, cp: &Value) -> bool {
    let proto = |v: &Value| str_at(v, &["protocol"]).unwrap_or("TCP").to_string();
    let number = at(cp, &["containerPort"]).as_u64();
    let ports = seq(rule, &["ports"]);
    ports.is_empty()
        || ports.iter().any(|p| {
            let port = at(p, &["port"]);
            let hit = match (port.as_u64(), at(p, &["endPort"]).as_u64()) {
                (Some(lo), Some(hi)) => number.is_some_and(|n| (lo..=hi).contains(&n)),
                (Some(n), None) => number == Some(n),
                (None, _) => port.is_null() || port.as_str() == str_at(cp, &["name"]),
            };
            hit && proto(p) == proto(cp)
        })
}

#[tokio::test]
async fn network_policies_admit_only_prometheus_to_the_admin_port_and_keep_the_apps_ports() {
    let pods = effective().await;
    let policies: Vec<manifests::Doc> = manifests::docs()
        .into_iter()
        .filter(|d| d.kind() == "NetworkPolicy")
        .collect();
    assert!(!policies.is_empty(), "no NetworkPolicy under deploy/");
    let results = policies.iter().map(|np| {
        let rel = np.file.strip_prefix(manifests::root()).unwrap_or(&np.file);
        let beside: Vec<_> = pods
            .iter()
            .filter(|(p, _)| p.file.parent() == np.file.parent())
            .collect();
        (
            format!("{} NetworkPolicy", rel.display()),
            network_policy_holds(&np.value, &beside),
        )
    });
    assert_all(results.collect());
}

/// The policy selects courier pods of its folder; on each, every rule that
/// admits the admin port admits only labelled pods of the namespace, and
/// every port of the app's containers stays admitted.
fn network_policy_holds(
    np: &Value,
    pods: &[&(CourierPod, Result<sidecar::Effective, String>)],
) -> Result<(), String> {
    if !seq(np, &["spec", "policyTypes"])
        .iter()
        .any(|t| t.as_str() == Some("Ingress"))
    {
        return Err("policyTypes lacks Ingress".into());
    }
    if !at(np, &["spec", "podSelector", "matchExpressions"]).is_null() {
        return Err("matchExpressions are not supported by this test".into());
    }
    let want = at(np, &["spec", "podSelector", "matchLabels"])
        .as_mapping()
        .ok_or("no spec.podSelector.matchLabels")?;
    let rules = seq(np, &["spec", "ingress"]);
    let mut selected = 0;
    for (p, e) in pods {
        let labels = at(p.template(), &["metadata", "labels"]);
        if !want.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            continue;
        }
        selected += 1;
        let e = e.as_ref().map_err(String::clone)?;
        let admin = seq(&p.container, &["ports"])
            .iter()
            .find(|cp| at(cp, &["containerPort"]).as_u64() == Some(u64::from(e.admin_port)))
            .ok_or_else(|| format!("{}: the admin port is no container port", p.name))?;
        let to_admin: Vec<&Value> = rules.iter().filter(|r| admits(r, admin)).collect();
        if to_admin.is_empty() {
            return Err(format!("{}: nothing may reach the admin port", p.name));
        }
        for rule in to_admin {
            let from = seq(rule, &["from"]);
            let only_labelled_pods = !from.is_empty()
                && from.iter().all(|peer| {
                    peer.as_mapping().is_some_and(|m| m.len() == 1)
                        && at(peer, &["podSelector", "matchLabels"])
                            .as_mapping()
                            .is_some_and(|l| !l.is_empty())
                });
            if !only_labelled_pods {
                return Err(format!(
                    "{}: a rule admits the admin port from more than labelled pods of this namespace",
                    p.name
                ));
            }
        }
        for c in p.containers().filter(|c| !manifests::is_courier(c)) {
            for cp in seq(c, &["ports"]) {
                if !rules.iter().any(|r| admits(r, cp)) {
                    return Err(format!(
                        "{}: the app's port {:?} is no longer admitted",
                        p.name,
                        str_at(cp, &["name"])
                    ));
                }
            }
        }
    }
    if selected == 0 {
        return Err("its podSelector matches no pod template with courier".into());
    }
    Ok(())
}

/// Whether `.dockerignore` leaves `path` (a top-level name) out of the
/// build context: the last rule naming it wins, `!` re-includes.
fn docker_ignores(rules: &[&str], path: &str) -> bool {
    let mut ignored = false;
    for rule in rules {
        let (negate, pattern) = match rule.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, *rule),
        };
        let pattern = pattern.trim_start_matches('/').trim_end_matches('/');
        let pattern = pattern.strip_prefix("**/").unwrap_or(pattern);
        if pattern == path {
            ignored = !negate;
        }
    }
    ignored
}

#[test]
fn the_build_context_leaves_out_build_output_venv_and_journals() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".dockerignore"))
        .expect("read .dockerignore");
    let rules: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for out in ["target", ".venv", ".git", "data"] {
        assert!(
            docker_ignores(&rules, out),
            ".dockerignore does not exclude {out}/"
        );
    }
    // `cargo build --locked` in the image needs these.
    for needed in ["src", "Cargo.toml", "Cargo.lock", "benches", ".cargo"] {
        assert!(
            !docker_ignores(&rules, needed),
            ".dockerignore excludes {needed}"
        );
    }
}
