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
use futures::StreamExt;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
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

/// Keys listed per request.
const PAGE: usize = 1000;
/// Requests one listing makes at most: a million keys, with room for
/// a few thousand that are not paths (each costs about ten requests).
const MAX_LIST_REQUESTS: usize = 2000;

/// An opened store and the prefix every object of ours is under.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// The same store's page-by-page listing, for a cloud store: a key
    /// that is not an `object_store` path (`..`, `//`) fails the page that
    /// holds it, and only a listing that starts after that key can go on.
    pager: Option<Arc<dyn PaginatedListStore>>,
    prefix: Path,
    /// The URL, as the `store` label of the metrics and in the log.
    label: String,
    /// A local folder: its files are made 0600 (they hold bodies).
    local: Option<std::path::PathBuf>,
}

/// A listing: the objects, and the keys that are not paths.
#[derive(Debug, Default)]
pub struct Listed {
    pub objects: Vec<ObjectMeta>,
    pub skipped: Vec<String>,
}

/// Why `get_at_most` gave no object.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("the object is larger than it can be ({0} bytes)")]
    TooLarge(u64),
    #[error(transparent)]
    Store(object_store::Error),
}

/// The key an error of a listing is about, when the listing failed only
/// because that key is not an `object_store` path.
fn odd_key(e: &object_store::Error) -> Option<String> {
    use object_store::path::Error as P;
    match e {
        object_store::Error::InvalidPath {
            source:
                P::EmptySegment { path } | P::BadSegment { path, .. } | P::NonUnicode { path, .. },
        } => Some(path.clone()),
        _ => None,
    }
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
        // The stores' HTTP client takes the process' rustls provider: ring,
        // as everywhere in courier. Already installed is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
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
        type Opened = (Arc<dyn ObjectStore>, Option<Arc<dyn PaginatedListStore>>);
        fn both<S: ObjectStore + PaginatedListStore>(s: S) -> Opened {
            let s = Arc::new(s);
            (s.clone(), Some(s))
        }
        let ((store, pager), prefix, local): (Opened, &str, _) = match url.scheme {
            Scheme::S3 => (
                both(
                    object_store::aws::AmazonS3Builder::from_env()
                        .with_url(url.url.as_str())
                        .with_retry(retry)
                        .build()?,
                ),
                inside,
                None,
            ),
            Scheme::Azure => (
                both(
                    object_store::azure::MicrosoftAzureBuilder::from_env()
                        .with_url(url.url.as_str())
                        .with_retry(retry)
                        .build()?,
                ),
                inside,
                None,
            ),
            Scheme::Gcs => (
                both(
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
                ((Arc::new(store), None), "", Some(root))
            }
        };
        Ok(Bucket {
            store,
            pager,
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
        self.tally(op, r.as_ref().err());
    }

    fn tally(&self, op: &'static str, error: Option<&object_store::Error>) {
        let result = match error {
            None => "ok",
            Some(object_store::Error::NotFound { .. }) => "not_found",
            Some(object_store::Error::AlreadyExists { .. }) => "exists",
            Some(_) => "error",
        };
        crate::metrics::object_store_request(&self.label, op, result);
    }

    /// `e`, counted as the failure of `op`.
    fn failed(&self, op: &'static str, e: object_store::Error) -> object_store::Error {
        self.tally(op, Some(&e));
        e
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

    /// Every object under `prefix`, at any depth, sorted by path. A key
    /// that is not a path of ours is left out, with a warning.
    pub async fn list(&self, prefix: &Path) -> object_store::Result<Vec<ObjectMeta>> {
        let listed = self.list_keys(prefix).await?;
        for key in &listed.skipped {
            tracing::warn!(store = %self.label, key = %key.escape_debug(), "skipping an object whose key is not a path courier reads");
        }
        Ok(listed.objects)
    }

    /// Every object under `prefix`, and the keys skipped: whatever else is
    /// in the bucket, one odd key never hides the others.
    pub async fn list_keys(&self, prefix: &Path) -> object_store::Result<Listed> {
        let mut listed = match &self.pager {
            Some(pager) => self.list_pages(pager.as_ref(), prefix).await?,
            None => self.list_stream(prefix).await?,
        };
        listed.objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(listed)
    }

    /// A local store's listing goes on past an entry it cannot read.
    async fn list_stream(&self, prefix: &Path) -> object_store::Result<Listed> {
        let mut listed = Listed::default();
        let mut stream = self.store.list(Some(prefix));
        // Bounded by the store's entries.
        while let Some(item) = stream.next().await {
            match item {
                Ok(meta) => listed.objects.push(meta),
                Err(e) => match odd_key(&e) {
                    Some(key) => listed.skipped.push(key),
                    None => return Err(self.failed("list", e)),
                },
            }
        }
        self.tally("list", None);
        Ok(listed)
    }

    /// A cloud store's listing, page by page. A page that fails on a key
    /// that is not a path is asked again, halved, until the key is alone
    /// in it; the listing then starts after that key. A few requests per
    /// odd key, and none for the others.
    async fn list_pages(
        &self,
        pager: &dyn PaginatedListStore,
        prefix: &Path,
    ) -> object_store::Result<Listed> {
        let mut listed = Listed::default();
        let mut from = format!("{prefix}/");
        if from == "/" {
            from.clear();
        }
        let (mut offset, mut token, mut max) = (None::<String>, None::<String>, PAGE);
        for _ in 0..MAX_LIST_REQUESTS {
            let opts = PaginatedListOptions {
                offset: offset.clone(),
                page_token: token.clone(),
                max_keys: Some(max),
                ..Default::default()
            };
            let r = pager.list_paginated(Some(from.as_str()), opts).await;
            self.count("list", &r);
            match r {
                Ok(page) => {
                    listed.objects.extend(page.result.objects);
                    max = PAGE;
                    match page.page_token {
                        Some(t) => token = Some(t),
                        None => return Ok(listed),
                    }
                }
                Err(e) => match odd_key(&e) {
                    Some(_) if max > 1 => max /= 2,
                    Some(key) => {
                        offset = Some(key.clone());
                        token = None;
                        listed.skipped.push(key);
                        max = PAGE;
                    }
                    None => return Err(e),
                },
            }
        }
        Err(object_store::Error::Generic {
            store: "list",
            source: format!("more than {MAX_LIST_REQUESTS} list requests under {prefix}").into(),
        })
    }

    /// The object at `path`, if it is at most `max` bytes; `Err(TooLarge)`
    /// without reading it when it is larger, or once more than `max` came.
    pub async fn get_at_most(&self, path: &Path, max: u64) -> Result<Option<Bytes>, GetError> {
        let got = match self.store.get(path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                self.tally("get", None);
                return Ok(None);
            }
            Err(e) => return Err(GetError::Store(self.failed("get", e))),
        };
        if got.meta.size > max {
            self.tally("get", None);
            return Err(GetError::TooLarge(got.meta.size));
        }
        let mut bytes = Vec::with_capacity(got.meta.size as usize);
        let mut stream = got.into_stream();
        // Bounded by `max`.
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) if (bytes.len() + chunk.len()) as u64 > max => {
                    self.tally("get", None);
                    return Err(GetError::TooLarge((bytes.len() + chunk.len()) as u64));
                }
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(e) => return Err(GetError::Store(self.failed("get", e))),
            }
        }
        self.tally("get", None);
        Ok(Some(Bytes::from(bytes)))
    }

    /// Moves the object at `from` to `to` inside the store, unread.
    pub async fn rename(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        let r = self.store.rename(from, to).await;
        self.count("rename", &r);
        r?;
        self.private(to);
        Ok(())
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
