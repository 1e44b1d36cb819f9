//! Where backups go, as object stores: an S3-compatible bucket, or a folder (a mounted volume).
//! How the operator and the pods it runs open one.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;

/// A bucket at `endpoint` (path-style requests, plain http allowed for an http URL), signed
/// with `(access key id, secret access key)`: the operator's and the restore pod's way in.
pub fn bucket(
    endpoint: &str,
    region: &str,
    bucket: &str,
    (key_id, secret): &(String, String),
) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(endpoint.starts_with("http://"))
        .with_virtual_hosted_style_request(false)
        .with_region(region)
        .with_bucket_name(bucket)
        .with_access_key_id(key_id)
        .with_secret_access_key(secret)
        .build()?;
    Ok(Arc::new(store))
}

/// A mounted volume as a store. Files are synced before they are renamed into place, and the
/// folder after: what is reported saved survives the node's power going.
pub fn folder(path: &std::path::Path) -> Result<Arc<LocalFileSystem>, object_store::Error> {
    Ok(Arc::new(LocalFileSystem::new_with_prefix(path)?.with_fsync(true)))
}
