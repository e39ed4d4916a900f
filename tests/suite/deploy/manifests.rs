//! The manifests under deploy/ as the tests see them: every pod template
//! that carries a courier container, with the ConfigMaps of its folder
//! (plain objects and Kustomize `configMapGenerator` outputs), and the
//! image's defaults from the Dockerfile.

use serde_norway::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// `v[k1][k2]...`, `Null` where a key is missing.
pub fn at<'a>(v: &'a Value, keys: &[&str]) -> &'a Value {
    keys.iter().fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
}

pub fn str_at<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a str> {
    at(v, keys).as_str()
}

pub fn seq<'a>(v: &'a Value, keys: &[&str]) -> &'a [Value] {
    at(v, keys).as_sequence().map_or(&[], Vec::as_slice)
}

/// One YAML document of a manifest file.
pub struct Doc {
    pub file: PathBuf,
    pub value: Value,
}

impl Doc {
    pub fn kind(&self) -> &str {
        str_at(&self.value, &["kind"]).unwrap_or("")
    }
}

/// A pod template (Deployment, StatefulSet, or a patch of one) with a
/// courier container, and what it needs from its folder.
pub struct CourierPod {
    /// File and object, for messages: `deploy/plain/deployment.yaml Deployment/shop`.
    pub name: String,
    /// Where it comes from: a manifest, or a kustomization folder it was rendered from.
    pub file: PathBuf,
    /// The workload object (`spec.template` is the pod template).
    pub workload: Value,
    /// The courier container and whether it is an init container.
    pub container: Value,
    pub in_init_containers: bool,
    /// ConfigMaps of the same folder, by name: key -> text.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
}

impl CourierPod {
    pub fn template(&self) -> &Value {
        at(&self.workload, &["spec", "template"])
    }

    pub fn pod_spec(&self) -> &Value {
        at(self.template(), &["spec"])
    }

    /// Every container of the pod template, init containers first.
    pub fn containers(&self) -> impl Iterator<Item = &Value> {
        seq(self.pod_spec(), &["initContainers"])
            .iter()
            .chain(seq(self.pod_spec(), &["containers"]))
    }

    /// A Kustomize patch (`*-patch.yaml`): a partial object that leaves
    /// the rest of the pod to the app it is applied to.
    pub fn is_patch(&self) -> bool {
        self.file
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with("-patch.yaml"))
    }

    /// A container environment variable's literal value.
    pub fn env_value(&self, name: &str) -> Option<&str> {
        seq(&self.container, &["env"])
            .iter()
            .find(|e| str_at(e, &["name"]) == Some(name))
            .and_then(|e| str_at(e, &["value"]))
    }
}

/// courier's image is `.../courier:TAG`.
pub fn is_courier(container: &Value) -> bool {
    let image = str_at(container, &["image"]).unwrap_or("");
    let repo = image.split(['@', ':']).next().unwrap_or("");
    repo.rsplit('/').next() == Some("courier")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("read_dir entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
}

pub fn parse_all(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_yaml(&text, &path.display().to_string())
}

/// The documents of a YAML stream; `what` names it in the panic.
pub fn parse_yaml(text: &str, what: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{what} is not YAML: {e}"))
        })
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Every manifest document under deploy/, except Kustomize's own files:
/// kustomization.yaml and the files its configMapGenerator reads.
pub fn docs() -> Vec<Doc> {
    let mut files = Vec::new();
    yaml_files(&root().join("deploy"), &mut files);
    let inputs: Vec<PathBuf> = files
        .iter()
        .filter(|f| f.ends_with("kustomization.yaml"))
        .flat_map(|k| generated(k).into_iter().flat_map(|(_, files)| files))
        .collect();
    files
        .into_iter()
        .filter(|f| !f.ends_with("kustomization.yaml") && !inputs.contains(f))
        .flat_map(|file| {
            parse_all(&file).into_iter().map(move |value| Doc {
                file: file.clone(),
                value,
            })
        })
        .collect()
}

/// A kustomization's configMapGenerator: name -> files it reads.
fn generated(kustomization: &Path) -> Vec<(String, Vec<PathBuf>)> {
    let dir = kustomization.parent().expect("a folder");
    parse_all(kustomization)
        .iter()
        .flat_map(|k| seq(k, &["configMapGenerator"]).to_vec())
        .map(|g| {
            let name = str_at(&g, &["name"])
                .expect("a generator has a name")
                .to_string();
            let files = seq(&g, &["files"])
                .iter()
                .filter_map(Value::as_str)
                // `key=path` or `path`; the key is then the file name.
                .map(|f| dir.join(f.rsplit('=').next().unwrap_or(f)))
                .collect();
            (name, files)
        })
        .collect()
}

/// The ConfigMaps visible in `dir`: its ConfigMap documents and its
/// kustomization's generated ones.
fn config_maps(dir: &Path, docs: &[Doc]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut maps = BTreeMap::new();
    for d in docs
        .iter()
        .filter(|d| d.file.parent() == Some(dir) && d.kind() == "ConfigMap")
    {
        let name = str_at(&d.value, &["metadata", "name"])
            .unwrap_or("")
            .to_string();
        maps.insert(name, config_map_data(&d.value));
    }
    let kustomization = dir.join("kustomization.yaml");
    if kustomization.exists() {
        for (name, files) in generated(&kustomization) {
            let data = files
                .iter()
                .map(|f| {
                    let key = f
                        .file_name()
                        .expect("a file")
                        .to_string_lossy()
                        .into_owned();
                    let text = std::fs::read_to_string(f)
                        .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                    (key, text)
                })
                .collect();
            maps.insert(name, data);
        }
    }
    maps
}

/// A ConfigMap's `data`: key -> text.
pub fn config_map_data(cm: &Value) -> BTreeMap<String, String> {
    at(cm, &["data"])
        .as_mapping()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
        .collect()
}

/// Where the ConfigMaps a manifest mounts are: its own folder, but for a
/// component's patch (`*-patch.yaml`), whose `courier-config` each app's
/// kustomization generates, the example app's folder.
fn config_dir(file: &Path) -> PathBuf {
    let is_patch = file
        .file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with("-patch.yaml"));
    if is_patch {
        root().join("deploy/kustomize/overlays/example")
    } else {
        file.parent().expect("a folder").to_path_buf()
    }
}

/// Every courier container of every workload under deploy/.
pub fn courier_pods() -> Vec<CourierPod> {
    let docs = docs();
    let mut pods = Vec::new();
    for d in docs
        .iter()
        .filter(|d| at(&d.value, &["spec", "template"]).is_mapping())
    {
        let spec = at(&d.value, &["spec", "template", "spec"]);
        for (list, init) in [("initContainers", true), ("containers", false)] {
            for c in seq(spec, &[list]).iter().filter(|c| is_courier(c)) {
                let rel = d.file.strip_prefix(root()).unwrap_or(&d.file);
                pods.push(CourierPod {
                    name: format!(
                        "{} {}/{}",
                        rel.display(),
                        d.kind(),
                        str_at(&d.value, &["metadata", "name"]).unwrap_or("?")
                    ),
                    file: d.file.clone(),
                    workload: d.value.clone(),
                    container: c.clone(),
                    in_init_containers: init,
                    config_maps: config_maps(&config_dir(&d.file), &docs),
                });
            }
        }
    }
    pods
}

/// The image's `ENV` and `USER` from the Dockerfile's last stage.
pub struct Image {
    pub env: BTreeMap<String, String>,
    pub user: String,
}

pub fn image() -> Image {
    let path = root().join("Dockerfile");
    let text = std::fs::read_to_string(&path).expect("read Dockerfile");
    let joined = text.replace("\\\n", " ");
    let last_stage = joined
        .rsplit_once("\nFROM ")
        .map_or(joined.as_str(), |(_, s)| s);
    let mut image = Image {
        env: BTreeMap::new(),
        user: String::new(),
    };
    for line in last_stage.lines().map(str::trim) {
        if let Some(vars) = line.strip_prefix("ENV ") {
            for pair in vars.split_whitespace() {
                if let Some((k, v)) = pair.split_once('=') {
                    image.env.insert(k.to_string(), v.to_string());
                }
            }
        } else if let Some(user) = line.strip_prefix("USER ") {
            image.user = user.trim().to_string();
        }
    }
    image
}
