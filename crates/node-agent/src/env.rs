//! Container environment: `env`, `envFrom` and `$(VAR)` expansion, with the kubelet's rules.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret};
use kube::{Api, Client};

use crate::downward::{self, PodFacts};
use crate::volumes::KeyedData;

/// Why a container's environment cannot be built (reported as CreateContainerConfigError).
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("{kind} {name:?} not found")]
    MissingObject { kind: &'static str, name: String },
    #[error("key {key:?} not found in {kind} {name:?}")]
    MissingKey {
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("env {var}: {message}")]
    Invalid { var: String, message: String },
    #[error("reading {kind} {name:?} failed: {source}")]
    Api {
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
}

/// The ConfigMaps and Secrets a container's environment refers to, fetched once per start.
/// `None` records an object that does not exist.
#[derive(Debug, Default, Clone)]
pub struct EnvSources {
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    pub secrets: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
}

impl EnvSources {
    /// Fetches every ConfigMap and Secret that `container` refers to from its env.
    pub async fn fetch(client: &Client, namespace: &str, container: &Container) -> Result<Self, EnvError> {
        let mut wanted_cms = vec![];
        let mut wanted_secrets = vec![];
        for from in container.env_from.iter().flatten() {
            wanted_cms.extend(from.config_map_ref.as_ref().map(|r| r.name.clone()));
            wanted_secrets.extend(from.secret_ref.as_ref().map(|r| r.name.clone()));
        }
        for var in container.env.iter().flatten() {
            let Some(from) = &var.value_from else { continue };
            wanted_cms.extend(from.config_map_key_ref.as_ref().map(|r| r.name.clone()));
            wanted_secrets.extend(from.secret_key_ref.as_ref().map(|r| r.name.clone()));
        }
        let mut sources = Self::default();
        for name in wanted_cms {
            if let Entry::Vacant(slot) = sources.config_maps.entry(name.clone()) {
                slot.insert(fetch::<ConfigMap>(client, namespace, &name).await?);
            }
        }
        for name in wanted_secrets {
            if let Entry::Vacant(slot) = sources.secrets.entry(name.clone()) {
                slot.insert(fetch::<Secret>(client, namespace, &name).await?);
            }
        }
        Ok(sources)
    }
}

async fn fetch<K: KeyedData>(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, EnvError> {
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let found = api.get_opt(name).await.map_err(|source| EnvError::Api {
        kind: K::KIND,
        name: name.to_string(),
        source,
    })?;
    Ok(found.map(|o| o.key_bytes()))
}

/// Builds the container's own environment (without the image defaults), in the kubelet's order:
/// `envFrom` sources first, then `env` entries, each expanding `$(VAR)` from what came before.
pub fn container_env(
    facts: &PodFacts<'_>,
    container: &Container,
    sources: &EnvSources,
    service_env: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut vars: Vec<(String, String)> = vec![];
    let set = |vars: &mut Vec<(String, String)>, k: String, v: String| {
        if let Some(slot) = vars.iter_mut().find(|(name, _)| *name == k) {
            slot.1 = v;
        } else {
            vars.push((k, v));
        }
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, optional, data) = if let Some(r) = &from.config_map_ref {
            ("configmap", &r.name, r.optional, sources.config_maps.get(&r.name))
        } else if let Some(r) = &from.secret_ref {
            ("secret", &r.name, r.optional, sources.secrets.get(&r.name))
        } else {
            continue;
        };
        match data.and_then(|d| d.as_ref()) {
            Some(data) => {
                for (k, v) in data {
                    set(
                        &mut vars,
                        format!("{prefix}{k}"),
                        String::from_utf8_lossy(v).into_owned(),
                    );
                }
            }
            None if optional.unwrap_or(false) => {}
            None => {
                return Err(EnvError::MissingObject {
                    kind,
                    name: name.clone(),
                });
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(from) = &var.value_from {
            let invalid = |message: String| EnvError::Invalid {
                var: var.name.clone(),
                message,
            };
            if let Some(field) = &from.field_ref {
                downward::field_value(facts, &field.field_path).map_err(|e| invalid(e.0))?
            } else if let Some(resource) = &from.resource_field_ref {
                downward::resource_value(facts, container, resource).map_err(|e| invalid(e.0))?
            } else if let Some(r) = &from.config_map_key_ref {
                match key_value("configmap", &r.name, &r.key, sources.config_maps.get(&r.name))? {
                    Some(v) => v,
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(EnvError::MissingKey {
                            kind: "configmap",
                            name: r.name.clone(),
                            key: r.key.clone(),
                        });
                    }
                }
            } else if let Some(r) = &from.secret_key_ref {
                match key_value("secret", &r.name, &r.key, sources.secrets.get(&r.name)) {
                    Ok(Some(v)) => v,
                    Ok(None) | Err(EnvError::MissingObject { .. }) if r.optional.unwrap_or(false) => continue,
                    Ok(None) => {
                        return Err(EnvError::MissingKey {
                            kind: "secret",
                            name: r.name.clone(),
                            key: r.key.clone(),
                        });
                    }
                    Err(e) => return Err(e),
                }
            } else {
                return Err(invalid("valueFrom has no supported source".into()));
            }
        } else {
            let lookup = |name: &str| {
                vars.iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .or_else(|| service_env.get(name).cloned())
            };
            expand(var.value.as_deref().unwrap_or(""), &lookup)
        };
        set(&mut vars, var.name.clone(), value);
    }
    Ok(vars)
}

fn key_value(
    kind: &'static str,
    name: &str,
    key: &str,
    data: Option<&Option<BTreeMap<String, Vec<u8>>>>,
) -> Result<Option<String>, EnvError> {
    match data.and_then(|d| d.as_ref()) {
        Some(map) => Ok(map.get(key).map(|v| String::from_utf8_lossy(v).into_owned())),
        None => Err(EnvError::MissingObject {
            kind,
            name: name.to_string(),
        }),
    }
}

/// Expands `$(NAME)` references; `$$` escapes a dollar; unknown references stay as written.
pub fn expand(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        match chars.peek().map(|&(_, c)| c) {
            Some('$') => {
                chars.next();
                out.push('$');
            }
            Some('(') => {
                let rest = &text[i + 2..];
                match rest.find(')') {
                    Some(end) => {
                        let name = &rest[..end];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => out.push_str(&text[i..i + 3 + end]),
                        }
                        // Skip past the closing parenthesis.
                        for (j, _) in chars.by_ref() {
                            if j == i + 2 + end {
                                break;
                            }
                        }
                    }
                    None => out.push('$'),
                }
            }
            _ => out.push('$'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, EnvFromSource, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, SecretKeySelector,
    };
    use std::net::Ipv4Addr;

    fn lookup(name: &str) -> Option<String> {
        (name == "A").then(|| "1".to_string())
    }

    #[test]
    fn expansion_rules() {
        assert_eq!(expand("x$(A)y", &lookup), "x1y");
        assert_eq!(expand("$(B)", &lookup), "$(B)");
        assert_eq!(expand("$$(A)", &lookup), "$(A)");
        assert_eq!(expand("a$b$", &lookup), "a$b$");
        assert_eq!(expand("$(A", &lookup), "$(A");
        assert_eq!(expand("é$(A)é", &lookup), "é1é");
    }

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    #[test]
    fn env_from_then_env_with_refs() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        let facts = PodFacts {
            pod: &pod,
            pod_ip: Ipv4Addr::new(10, 0, 0, 5),
            host_ip: Ipv4Addr::new(10, 0, 0, 1),
            node_cpu: 1.0,
            node_memory: 1.0,
        };
        let container = Container {
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "cm".into(),
                    optional: None,
                }),
                prefix: Some("CM_".into()),
                secret_ref: None,
            }]),
            env: Some(vec![
                var("HOST", "$(CM_host):80"),
                EnvVar {
                    name: "IP".into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "status.podIP".into(),
                            api_version: None,
                        }),
                        ..Default::default()
                    }),
                },
                EnvVar {
                    name: "PASSWORD".into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "s".into(),
                            key: "pw".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                },
                var("CM_host", "override"),
            ]),
            ..Default::default()
        };
        let sources = EnvSources {
            config_maps: BTreeMap::from([(
                "cm".into(),
                Some(BTreeMap::from([("host".to_string(), b"db".to_vec())])),
            )]),
            secrets: BTreeMap::from([(
                "s".into(),
                Some(BTreeMap::from([("pw".to_string(), b"hunter2".to_vec())])),
            )]),
        };
        let env: BTreeMap<_, _> = container_env(&facts, &container, &sources, &BTreeMap::new())
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(env["HOST"], "db:80");
        assert_eq!(env["IP"], "10.0.0.5");
        assert_eq!(env["PASSWORD"], "hunter2");
        assert_eq!(env["CM_host"], "override");

        let missing = EnvSources::default();
        let err = container_env(&facts, &container, &missing, &BTreeMap::new()).unwrap_err();
        assert!(
            matches!(err, EnvError::MissingObject { kind: "configmap", .. }),
            "{err}"
        );
    }
}
