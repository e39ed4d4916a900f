//! Object storage (docs/object-storage.md): the one place that opens a store from a URL,
//! with credentials, region and endpoint from the cloud's own environment
//! (`object_store`'s `from_env`), never from the config file, and that
//! counts every request in `courier_object_store_requests_total`.
//!
//! Requests are retried by `object_store` for a short while only
//! (`RETRY_FOR`): the callers keep what they could not store and try again
//! with their own backoff, where it shows on `/v1/destinations` and in the
//! log, rather than hanging for `object_store`'s default three minutes.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use std::sync::Arc;
use std::time::Duration;

/// How long `object_store` retries one request before it answers an error.
const RETRY_FOR: Duration = Duration::from_secs(10);

/// A URL that names no store courier can open (checked at config load).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UrlError {
    #[error(
        "`{0}` is not a URL (expected s3://bucket/prefix, az://container/prefix, gs://bucket/prefix or file:///path)"
    )]
    Malformed(String),
    #[error("`{0}`: the scheme `{1}` is not one of s3, az, gs, file")]
    Scheme(String, String),
    #[error("`{0}` names no bucket or container")]
    NoBucket(String),
    #[error("`{0}`: a file:// URL needs an absolute path and no host (file:///path)")]
    File(String),
}

/// The store's kind, and the prefix inside it, of a URL in the config.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreUrl {
    url: String,
    scheme: Scheme,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scheme {
    S3,
    Azure,
    Gcs,
    File,
}

impl StoreUrl {
    pub fn parse(text: &str) -> Result<StoreUrl, UrlError> {
        let url = url::Url::parse(text).map_err(|_| UrlError::Malformed(text.to_string()))?;
        let scheme = match url.scheme() {
            "s3" => Scheme::S3,
            "az" => Scheme::Azure,
            "gs" => Scheme::Gcs,
            "file" => Scheme::File,
            other => return Err(UrlError::Scheme(text.to_string(), other.to_string())),
        };
        let host = url.host_str().unwrap_or("");
        match scheme {
            Scheme::File if !host.is_empty() || url.path().len() <= 1 => {
                return Err(UrlError::File(text.to_string()));
            }
            Scheme::File => {}
            _ if host.is_empty() => return Err(UrlError::NoBucket(text.to_string())),
            _ => {}
        }
        Ok(StoreUrl {
            url: text.trim_end_matches('/').to_string(),
            scheme,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.url
    }
}

/// An opened store and the prefix every object of ours is under.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The URL, as the `store` label of the metrics and in the log.
    label: String,
    /// A local folder: its files are made 0600 (they hold bodies).
    local: Option<std::path::PathBuf>,
}

/// What a conditional create found.
#[derive(Debug, PartialEq)]
pub enum Created {
    /// The object is ours.
    Won,
    /// It existed already: someone else's.
    Exists,
}

impl Bucket {
    /// Opens the store of `url` with the environment's credentials; no
    /// request is made (a store that is down is found on first use).
    pub fn open(url: &StoreUrl) -> Result<Bucket, object_store::Error> {
        let parsed = url::Url::parse(&url.url).map_err(|e| object_store::Error::Generic {
            store: "url",
            source: Box::new(e),
        })?;
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.,
            },
            max_retries: 5,
            retry_timeout: RETRY_FOR,
        };
        let inside = parsed.path().trim_matches('/');
        let (store, prefix, local): (Arc<dyn ObjectStore>, &str, _) = match url.scheme {
            Scheme::S3 => (
                Arc::new(
                    object_store::aws::AmazonS3Builder::from_env()
                        .with_url(url.url.as_str())
                        .with_retry(retry)
                        .build()?,
                ),
                inside,
                None,
            ),
            Scheme::Azure => (
                Arc::new(
                    object_store::azure::MicrosoftAzureBuilder::from_env()
                        .with_url(url.url.as_str())
                        .with_retry(retry)
                        .build()?,
                ),
                inside,
                None,
            ),
            Scheme::Gcs => (
                Arc::new(
                    object_store::gcp::GoogleCloudStorageBuilder::from_env()
                        .with_url(url.url.as_str())
                        .with_retry(retry)
                        .build()?,
                ),
                inside,
                None,
            ),
            Scheme::File => {
                let root = std::path::PathBuf::from(parsed.path());
                std::fs::create_dir_all(&root).map_err(|e| object_store::Error::Generic {
                    store: "file",
                    source: Box::new(e),
                })?;
                let store = LocalFileSystem::new_with_prefix(&root)?.with_fsync(true);
                (Arc::new(store), "", Some(root))
            }
        };
        Ok(Bucket {
            store,
            prefix: Path::from(prefix),
            label: url.url.clone(),
            local,
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// The path of `parts` under the prefix.
    pub fn path<'a>(&self, parts: impl IntoIterator<Item = &'a str>) -> Path {
        let mut path = self.prefix.clone();
        for part in parts {
            path = path.clone().join(part);
        }
        path
    }

    /// `path` without the prefix: what the URL names it.
    pub fn url_of(&self, path: &Path) -> String {
        let tail = path
            .prefix_match(&self.prefix)
            .map(|parts| {
                parts
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| path.to_string());
        format!("{}/{tail}", self.label)
    }

    fn count<T>(&self, op: &'static str, r: &object_store::Result<T>) {
        let result = match r {
            Ok(_) => "ok",
            Err(object_store::Error::NotFound { .. }) => "not_found",
            Err(object_store::Error::AlreadyExists { .. }) => "exists",
            Err(_) => "error",
        };
        crate::metrics::object_store_request(&self.label, op, result);
    }

    /// Stores `bytes` at `path`, replacing what is there.
    pub async fn put(&self, path: &Path, bytes: Bytes) -> object_store::Result<()> {
        let r = self.store.put(path, PutPayload::from(bytes)).await;
        self.count("put", &r);
        r?;
        self.private(path);
        Ok(())
    }

    /// Stores `bytes` at `path` only if nothing is there: of couriers that
    /// race for the same path, exactly one wins.
    pub async fn create(&self, path: &Path, bytes: Bytes) -> object_store::Result<Created> {
        let opts = PutOptions::from(PutMode::Create);
        let r = self
            .store
            .put_opts(path, PutPayload::from(bytes), opts)
            .await;
        self.count("create", &r);
        match r {
            Ok(_) => {
                self.private(path);
                Ok(Created::Won)
            }
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Exists),
            Err(e) => Err(e),
        }
    }

    /// The object at `path`, or `None` if there is none.
    pub async fn get(&self, path: &Path) -> object_store::Result<Option<Bytes>> {
        let r = match self.store.get(path).await {
            Ok(got) => got.bytes().await,
            Err(e) => Err(e),
        };
        self.count("get", &r);
        match r {
            Ok(bytes) => Ok(Some(bytes)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every object under `prefix`, at any depth, sorted by path.
    pub async fn list(&self, prefix: &Path) -> object_store::Result<Vec<ObjectMeta>> {
        let r: object_store::Result<Vec<ObjectMeta>> =
            self.store.list(Some(prefix)).try_collect().await;
        self.count("list", &r);
        let mut objects = r?;
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(objects)
    }

    /// The names of the folders right under `prefix`, sorted.
    pub async fn folders(&self, prefix: &Path) -> object_store::Result<Vec<String>> {
        let r = self.store.list_with_delimiter(Some(prefix)).await;
        self.count("list", &r);
        let mut names: Vec<String> = r?
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    /// The objects right under `prefix` (not in its folders), sorted.
    pub async fn files(&self, prefix: &Path) -> object_store::Result<Vec<ObjectMeta>> {
        let r = self.store.list_with_delimiter(Some(prefix)).await;
        self.count("list", &r);
        let mut objects = r?.objects;
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(objects)
    }

    /// Removes the object at `path`; one already gone is no error.
    pub async fn delete(&self, path: &Path) -> object_store::Result<()> {
        let r = self.store.delete(path).await;
        self.count("delete", &r);
        match r {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A file of a local store holds bodies and headers: 0600, as the
    /// journal's (docs/dead-letters.md). Best effort: the store wrote it already.
    fn private(&self, path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        if let Some(root) = &self.local {
            let file = root.join(path.as_ref());
            if let Err(e) = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            {
                tracing::warn!(file = %file.display(), error = %e, "cannot make an object file private (0600)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_the_four_stores_are_taken_and_others_refused() {
        for ok in [
            "s3://bucket/prefix",
            "s3://bucket",
            "az://container/a/b",
            "gs://bucket/p",
            "file:///var/lib/courier/dl",
        ] {
            assert!(StoreUrl::parse(ok).is_ok(), "{ok}");
        }
        assert_eq!(
            StoreUrl::parse("http://x/y"),
            Err(UrlError::Scheme("http://x/y".into(), "http".into()))
        );
        assert_eq!(
            StoreUrl::parse("s3:///prefix"),
            Err(UrlError::NoBucket("s3:///prefix".into()))
        );
        assert_eq!(
            StoreUrl::parse("file://host/x"),
            Err(UrlError::File("file://host/x".into()))
        );
        assert_eq!(
            StoreUrl::parse("bucket/prefix"),
            Err(UrlError::Malformed("bucket/prefix".into()))
        );
    }

    #[tokio::test]
    async fn a_conditional_create_has_one_winner_and_a_local_object_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).expect("url");
        let bucket = Bucket::open(&url).expect("open");
        let path = bucket.path(["claims", "a"]);
        assert_eq!(
            bucket
                .create(&path, Bytes::from_static(b"1"))
                .await
                .expect("create"),
            Created::Won
        );
        assert_eq!(
            bucket
                .create(&path, Bytes::from_static(b"2"))
                .await
                .expect("create"),
            Created::Exists
        );
        assert_eq!(
            bucket.get(&path).await.expect("get").as_deref(),
            Some(&b"1"[..])
        );
        let mode = std::fs::metadata(dir.path().join("claims/a"))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        bucket.delete(&path).await.expect("delete");
        bucket
            .delete(&path)
            .await
            .expect("a second delete is no error");
        assert_eq!(bucket.get(&path).await.expect("get"), None);
    }
}
