//! Pod volumes: each volume becomes a folder on this machine that containers bind-mount.
//!
//! emptyDir, configMap, secret, downwardAPI and projected volumes live in the pod's folder;
//! persistentVolumeClaim and hostPath volumes are the host folders they name (the local-path
//! provisioner makes PVs that are host folders). Files of configMap, secret, downwardAPI and
//! projected volumes are written atomically and refreshed while the pod runs, which also renews
//! service-account tokens before they expire.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
    Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::atomic_dir::{self, FileContent, FileSet};
use crate::downward::{self, PodFacts};

/// Why a volume could not be prepared. `NotReady` is expected to clear by itself (an unbound
/// claim, a missing ConfigMap that may still be created) and is retried.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume:?}: {message}")]
    NotReady { volume: String, message: String },
    #[error("volume {volume:?}: {message}")]
    Invalid { volume: String, message: String },
    #[error("volume {volume:?}: API request failed: {source}")]
    Api { volume: String, source: kube::Error },
    #[error("volume {volume:?}: {source}")]
    Io { volume: String, source: std::io::Error },
}

impl VolumeError {
    /// The reason the kubelet reports for this failure in events.
    pub fn reason(&self) -> &'static str {
        "FailedMount"
    }
}

/// The default file mode of configMap, secret, downwardAPI and projected files (0644).
const DEFAULT_MODE: i32 = 0o644;

/// Prepares pod volumes against the API server.
pub struct Volumes<'a> {
    pub client: &'a Client,
    pub facts: PodFacts<'a>,
    /// `<pod folder>/volumes`.
    pub dir: &'a Path,
    /// The pod's fsGroup: files of generated volumes are chowned to it.
    pub fs_group: Option<u32>,
}

impl Volumes<'_> {
    fn pod(&self) -> &Pod {
        self.facts.pod
    }

    fn namespace(&self) -> String {
        self.pod()
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into())
    }

    /// Prepares every volume of the pod and returns the host folder of each.
    pub async fn prepare_all(&self) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        let volumes = self
            .pod()
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        let mut out = BTreeMap::new();
        for volume in &volumes {
            out.insert(volume.name.clone(), self.prepare(volume).await?);
        }
        Ok(out)
    }

    /// Rewrites the generated volumes (configMap, secret, downwardAPI, projected) with current
    /// data; unchanged files are left alone.
    pub async fn refresh(&self) -> Result<(), VolumeError> {
        let volumes = self
            .pod()
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        for volume in volumes.iter().filter(|v| is_generated(v)) {
            self.prepare(volume).await?;
        }
        Ok(())
    }

    async fn prepare(&self, volume: &Volume) -> Result<PathBuf, VolumeError> {
        let name = volume.name.as_str();
        let io = |source| VolumeError::Io {
            volume: name.to_string(),
            source,
        };
        let own_dir = self.dir.join(name);
        if volume.empty_dir.is_some() {
            if !own_dir.exists() {
                std::fs::create_dir_all(&own_dir).map_err(io)?;
                // As the kubelet makes it: any user of the pod may write there.
                open_to_all(&own_dir).map_err(io)?;
            }
            self.share_with_group(&own_dir).map_err(io)?;
            return Ok(own_dir);
        }
        if let Some(host) = &volume.host_path {
            let path = PathBuf::from(&host.path);
            if host.type_.as_deref() == Some("DirectoryOrCreate") {
                std::fs::create_dir_all(&path).map_err(io)?;
            }
            return Ok(path);
        }
        if let Some(claim) = &volume.persistent_volume_claim {
            return self.claim_path(name, &claim.claim_name).await;
        }
        let files = if let Some(cm) = &volume.config_map {
            let data = self
                .keyed_data::<ConfigMap>(name, &cm.name, cm.optional.unwrap_or(false))
                .await?;
            select_keys(name, &data, cm.items.as_deref(), cm.default_mode)?
        } else if let Some(secret) = &volume.secret {
            let secret_name = secret.secret_name.clone().unwrap_or_default();
            let optional = secret.optional.unwrap_or(false);
            let data = self.keyed_data::<Secret>(name, &secret_name, optional).await?;
            select_keys(name, &data, secret.items.as_deref(), secret.default_mode)?
        } else if let Some(dapi) = &volume.downward_api {
            downward_files(
                name,
                &self.facts,
                dapi.items.as_deref().unwrap_or(&[]),
                dapi.default_mode,
            )?
        } else if let Some(projected) = &volume.projected {
            self.projected_files(name, projected).await?
        } else {
            return Err(VolumeError::Invalid {
                volume: name.to_string(),
                message: "unsupported volume type on the local Kubernetes (supported: emptyDir, \
                          hostPath, persistentVolumeClaim, configMap, secret, downwardAPI, \
                          projected)"
                    .into(),
            });
        };
        atomic_dir::write(&own_dir, &files, self.fs_group).map_err(io)?;
        Ok(own_dir)
    }

    fn share_with_group(&self, dir: &Path) -> std::io::Result<()> {
        if let Some(gid) = self.fs_group {
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::chown(dir, None, Some(gid))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o2775))?;
        }
        Ok(())
    }

    async fn claim_path(&self, volume: &str, claim: &str) -> Result<PathBuf, VolumeError> {
        let api_err = |source| VolumeError::Api {
            volume: volume.to_string(),
            source,
        };
        let not_ready = |message: String| VolumeError::NotReady {
            volume: volume.to_string(),
            message,
        };
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &self.namespace());
        let pvc = pvcs
            .get_opt(claim)
            .await
            .map_err(api_err)?
            .ok_or_else(|| not_ready(format!("persistentvolumeclaim {claim:?} not found")))?;
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|_| bound);
        let pv_name = pv_name.ok_or_else(|| not_ready(format!("persistentvolumeclaim {claim:?} is not bound yet")))?;
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let pv = pvs.get(&pv_name).await.map_err(api_err)?;
        let spec = pv.spec.unwrap_or_default();
        let path = spec
            .host_path
            .map(|h| h.path)
            .or(spec.local.map(|l| l.path))
            .ok_or_else(|| VolumeError::Invalid {
                volume: volume.to_string(),
                message: format!("persistentvolume {pv_name:?} is neither hostPath nor local"),
            })?;
        let path = PathBuf::from(path);
        if !path.exists() {
            let io = |source| VolumeError::Io {
                volume: volume.to_string(),
                source,
            };
            std::fs::create_dir_all(&path).map_err(io)?;
            open_to_all(&path).map_err(io)?;
        }
        Ok(path)
    }

    /// The data of a ConfigMap or Secret; a missing object is empty if `optional`.
    async fn keyed_data<K: KeyedData>(
        &self,
        volume: &str,
        name: &str,
        optional: bool,
    ) -> Result<BTreeMap<String, Vec<u8>>, VolumeError> {
        let api: Api<K> = Api::namespaced(self.client.clone(), &self.namespace());
        match api.get_opt(name).await {
            Ok(Some(object)) => Ok(object.key_bytes()),
            Ok(None) if optional => Ok(BTreeMap::new()),
            Ok(None) => Err(VolumeError::NotReady {
                volume: volume.to_string(),
                message: format!("{} {name:?} not found", K::KIND),
            }),
            Err(source) => Err(VolumeError::Api {
                volume: volume.to_string(),
                source,
            }),
        }
    }

    async fn projected_files(
        &self,
        volume: &str,
        projected: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    ) -> Result<FileSet, VolumeError> {
        let mut files = FileSet::new();
        let default_mode = projected.default_mode;
        for source in projected.sources.iter().flatten() {
            let part = if let Some(cm) = &source.config_map {
                let data = self
                    .keyed_data::<ConfigMap>(volume, &cm.name, cm.optional.unwrap_or(false))
                    .await?;
                select_keys(volume, &data, cm.items.as_deref(), default_mode)?
            } else if let Some(secret) = &source.secret {
                let data = self
                    .keyed_data::<Secret>(volume, &secret.name, secret.optional.unwrap_or(false))
                    .await?;
                select_keys(volume, &data, secret.items.as_deref(), default_mode)?
            } else if let Some(dapi) = &source.downward_api {
                downward_files(volume, &self.facts, dapi.items.as_deref().unwrap_or(&[]), default_mode)?
            } else if let Some(token) = &source.service_account_token {
                let written = std::fs::read_to_string(self.dir.join(volume).join(&token.path)).ok();
                let jwt = match written.filter(|jwt| token_still_fresh(jwt, jiff::Timestamp::now().as_second())) {
                    Some(jwt) => jwt,
                    None => {
                        self.request_token(volume, token.audience.clone(), token.expiration_seconds)
                            .await?
                    }
                };
                let mode = default_mode.unwrap_or(DEFAULT_MODE) as u32;
                FileSet::from([(
                    token.path.clone(),
                    FileContent {
                        data: jwt.into_bytes(),
                        mode,
                    },
                )])
            } else {
                continue;
            };
            files.extend(part);
        }
        Ok(files)
    }

    /// Asks the API server for a token bound to this pod (TokenRequest API), as the kubelet does.
    async fn request_token(
        &self,
        volume: &str,
        audience: Option<String>,
        expiration_seconds: Option<i64>,
    ) -> Result<String, VolumeError> {
        let pod = self.pod();
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.into_iter().collect(),
                expiration_seconds: Some(expiration_seconds.unwrap_or(3600)),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let response = api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
            .map_err(|source| VolumeError::Api {
                volume: volume.to_string(),
                source,
            })?;
        response.status.map(|s| s.token).ok_or_else(|| VolumeError::NotReady {
            volume: volume.to_string(),
            message: "token request returned no token".into(),
        })
    }
}

/// Whether a token already written is kept rather than asked for again: as the kubelet does, a
/// token is renewed once 80% of its life has passed or it is a day old. Asking for a new one at
/// every volume refresh would sign a token per pod every few seconds.
fn token_still_fresh(jwt: &str, now: i64) -> bool {
    use base64::Engine as _;
    #[derive(serde::Deserialize)]
    struct Claims {
        iat: i64,
        exp: i64,
    }
    let claims = jwt
        .split('.')
        .nth(1)
        .and_then(|payload| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok())
        .and_then(|json| serde_json::from_slice::<Claims>(&json).ok());
    let Some(Claims { iat, exp }) = claims else {
        return false;
    };
    let renew_at = iat + (exp - iat) * 4 / 5;
    now < renew_at.min(iat + 24 * 3600)
}

fn is_generated(v: &Volume) -> bool {
    v.config_map.is_some() || v.secret.is_some() || v.downward_api.is_some() || v.projected.is_some()
}

/// ConfigMaps and Secrets: objects whose data is a map of keys to bytes.
pub trait KeyedData:
    kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
{
    /// The kind, lower case, for messages.
    const KIND: &'static str;
    /// Every key with its bytes.
    fn key_bytes(&self) -> BTreeMap<String, Vec<u8>>;
}

impl KeyedData for ConfigMap {
    const KIND: &'static str = "configmap";
    fn key_bytes(&self) -> BTreeMap<String, Vec<u8>> {
        let text = self
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()));
        let binary = self.binary_data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone()));
        text.chain(binary).collect()
    }
}

impl KeyedData for Secret {
    const KIND: &'static str = "secret";
    /// data, and stringData (which a server never returns but a fixture may hold).
    fn key_bytes(&self) -> BTreeMap<String, Vec<u8>> {
        let data = self.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone()));
        let text = self
            .string_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()));
        data.chain(text).collect()
    }
}

/// Picks the files of a configMap or secret volume: all keys, or the listed `items`.
pub fn select_keys(
    volume: &str,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
) -> Result<FileSet, VolumeError> {
    let mode = |m: Option<i32>| m.or(default_mode).unwrap_or(DEFAULT_MODE) as u32 & 0o7777;
    let invalid = |message: String| VolumeError::Invalid {
        volume: volume.to_string(),
        message,
    };
    let mut files = FileSet::new();
    match items {
        None | Some([]) => {
            for (key, value) in data {
                files.insert(
                    key.clone(),
                    FileContent {
                        data: value.clone(),
                        mode: mode(None),
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                let value = data.get(&item.key).ok_or_else(|| VolumeError::NotReady {
                    volume: volume.to_string(),
                    message: format!("key {:?} not found", item.key),
                })?;
                atomic_dir::check_relative(&item.path).map_err(|e| invalid(e.to_string()))?;
                files.insert(
                    item.path.clone(),
                    FileContent {
                        data: value.clone(),
                        mode: mode(item.mode),
                    },
                );
            }
        }
    }
    Ok(files)
}

/// The files of a downwardAPI volume.
pub fn downward_files(
    volume: &str,
    facts: &PodFacts<'_>,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<FileSet, VolumeError> {
    let invalid = |message: String| VolumeError::Invalid {
        volume: volume.to_string(),
        message,
    };
    let mut files = FileSet::new();
    for item in items {
        let value = if let Some(field) = &item.field_ref {
            downward::field_value(facts, &field.field_path).map_err(|e| invalid(e.0))?
        } else if let Some(resource) = &item.resource_field_ref {
            let containers = facts.pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or(&[]);
            let wanted = resource.container_name.as_deref();
            let container = containers
                .iter()
                .find(|c| Some(c.name.as_str()) == wanted || wanted.is_none())
                .ok_or_else(|| invalid(format!("no container {wanted:?} for resourceFieldRef")))?;
            downward::resource_value(facts, container, resource).map_err(|e| invalid(e.0))?
        } else {
            continue;
        };
        atomic_dir::check_relative(&item.path).map_err(|e| invalid(e.to_string()))?;
        let mode = item.mode.or(default_mode).unwrap_or(DEFAULT_MODE) as u32 & 0o7777;
        files.insert(
            item.path.clone(),
            FileContent {
                data: value.into_bytes(),
                mode,
            },
        );
    }
    Ok(files)
}

/// A new volume folder any user may write to (0777, whatever the umask), as the kubelet makes
/// an emptyDir and local-path provisioners make a volume: containers that run as their own
/// user (PostgreSQL's) make their data folders inside.
pub fn open_to_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        use base64::Engine as _;
        let part = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.signature", part(r#"{"alg":"RS256"}"#), part(claims))
    }

    #[test]
    fn a_token_is_kept_until_four_fifths_of_its_life_or_a_day() {
        let hour = jwt(r#"{"iat":1000,"exp":4600,"sub":"system:serviceaccount:a:b"}"#);
        assert!(token_still_fresh(&hour, 1000));
        assert!(token_still_fresh(&hour, 1000 + 2879));
        assert!(!token_still_fresh(&hour, 1000 + 2880), "renewed at 80% of an hour");
        let year = jwt(r#"{"iat":0,"exp":31536000}"#);
        assert!(token_still_fresh(&year, 86399));
        assert!(
            !token_still_fresh(&year, 86400),
            "renewed after a day whatever its expiry"
        );
    }

    #[test]
    fn a_file_that_is_not_a_token_is_asked_for_again() {
        assert!(!token_still_fresh("", 0));
        assert!(!token_still_fresh("not.a.jwt", 0));
        assert!(!token_still_fresh(&jwt(r#"{"iat":"x"}"#), 0));
    }

    #[test]
    fn items_pick_and_rename_keys() {
        let data = BTreeMap::from([("a".to_string(), b"1".to_vec()), ("b".to_string(), b"2".to_vec())]);
        let all = select_keys("v", &data, None, Some(0o600)).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all["a"].mode, 0o600);
        let items = [KeyToPath {
            key: "b".into(),
            path: "dir/b.txt".into(),
            mode: Some(0o400),
        }];
        let some = select_keys("v", &data, Some(&items), None).unwrap();
        assert_eq!(some.keys().collect::<Vec<_>>(), vec!["dir/b.txt"]);
        assert_eq!(some["dir/b.txt"].mode, 0o400);
        let missing = [KeyToPath {
            key: "zz".into(),
            path: "z".into(),
            mode: None,
        }];
        assert!(matches!(
            select_keys("v", &data, Some(&missing), None),
            Err(VolumeError::NotReady { .. })
        ));
        let escaping = [KeyToPath {
            key: "a".into(),
            path: "../a".into(),
            mode: None,
        }];
        assert!(matches!(
            select_keys("v", &data, Some(&escaping), None),
            Err(VolumeError::Invalid { .. })
        ));
    }
}
