//! Object store access shared by the source and store stages: turning the
//! URLs users write into [`Url`]s and building the matching `object_store`
//! client (local files, memory, S3, GCS, Azure) with options from the
//! environment and the spec.
//!
//! # Where settings come from
//!
//! A cloud client starts from the usual environment variables (`AWS_*`,
//! `GOOGLE_*`, `AZURE_*`); storage options given by the caller (a spec's
//! `storage_options`) override them key by key. Every option must be a
//! config key of the store of that scheme. Clients built here never show
//! their configuration: their `Debug` and `Display` name only the scheme
//! and bucket, so neither graphloom's logs nor those of the libraries it
//! hands the client to (deltalake logs the store it is given) can print a
//! key id or secret.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use futures::stream::BoxStream;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    ClientConfigKey, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreScheme, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    RenameOptions,
};
use url::Url;

/// Errors raised while resolving a location or building its client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocationError {
    /// The text is neither a URL nor a path.
    #[error("invalid location {location:?}: {reason}")]
    Invalid { location: String, reason: String },
    /// The URL's scheme has no object store.
    #[error("unsupported location {location}: use file://, memory://, s3://, gs:// or az://")]
    Unsupported { location: String },
    /// A storage option is not known to the store of that scheme.
    #[error(
        "unknown storage option `{key}` for {scheme} (see the object_store docs for its config keys)"
    )]
    UnknownOption { key: String, scheme: String },
    /// The client could not be configured (missing bucket, bad credentials config).
    #[error("cannot configure object store for {location}: {source}")]
    Store {
        location: String,
        #[source]
        source: object_store::Error,
    },
    /// The endpoint is plain HTTP but HTTP was not allowed: object_store
    /// would refuse every request with a less helpful message.
    #[error(
        "the endpoint of {location} is plain HTTP ({endpoint}): set `allow_http = \"true\"` in storage_options (or {env}=true) to use it"
    )]
    HttpNotAllowed {
        location: String,
        endpoint: String,
        env: &'static str,
    },
}

/// Result alias for location handling.
pub type Result<T, E = LocationError> = std::result::Result<T, E>;

/// Turns what a user wrote into a URL that ends with `/` (a directory).
///
/// Accepted: absolute URLs (`s3://bucket/prefix`, `memory:///graph`,
/// `file:///abs/path`), `file://./relative` and `file://relative` (relative
/// to the working directory), and plain paths.
pub fn parse_dir_url(text: &str) -> Result<Url> {
    let invalid = |reason: String| LocationError::Invalid {
        location: text.to_string(),
        reason,
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(invalid("empty location".into()));
    }
    let url = if let Some(rest) = text.strip_prefix("file://") {
        if rest.starts_with('/') {
            Url::parse(text).map_err(|e| invalid(e.to_string()))?
        } else {
            local_dir_url(rest).map_err(invalid)?
        }
    } else if text.contains("://") {
        Url::parse(text).map_err(|e| invalid(e.to_string()))?
    } else {
        local_dir_url(text).map_err(invalid)?
    };
    Ok(as_dir(url))
}

fn local_dir_url(path: &str) -> std::result::Result<Url, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("cannot read working directory: {e}"))?;
    let joined = cwd.join(path);
    // Normalise `./` and `../` lexically; the directory may not exist yet.
    let mut clean = std::path::PathBuf::new();
    for part in joined.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                clean.pop();
            }
            other => clean.push(other),
        }
    }
    Url::from_directory_path(&clean)
        .map_err(|_| format!("not an absolute path: {}", clean.display()))
}

fn as_dir(mut url: Url) -> Url {
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    url
}

/// In-memory stores live as long as the process; one per `memory://host`
/// so that every table of a memory graph sees the same objects.
fn memory_store(url: &Url) -> Arc<dyn ObjectStore> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    let key = url.host_str().unwrap_or_default().to_string();
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    stores
        .entry(key)
        .or_insert_with(|| Arc::new(InMemory::new()))
        .clone()
}

/// Builds the client for the store that holds `url`, rooted at the store's
/// root (the bucket or container, `/` for local files). Cloud stores read
/// the usual environment variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`) first;
/// `options` override them and must be known config keys.
pub fn store_for(url: &Url, options: &BTreeMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    // object_store only knows `memory:///`; graphloom also accepts a host
    // (`memory://name/`) to keep several in-memory graphs apart.
    if url.scheme() == "memory" {
        return Ok(memory_store(url));
    }
    let (scheme, _) = ObjectStoreScheme::parse(url).map_err(|_| LocationError::Unsupported {
        location: redacted(url),
    })?;
    let store_err = |source| LocationError::Store {
        location: redacted(url),
        source,
    };
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::Local => Arc::new(LocalFileSystem::new()),
        ObjectStoreScheme::Memory => memory_store(url),
        ObjectStoreScheme::AmazonS3 => {
            let mut b = AmazonS3Builder::from_env().with_url(url.as_str());
            for (key, v) in typed_options::<AmazonS3ConfigKey>(url, options)? {
                b = b.with_config(key, v);
            }
            check_http(
                url,
                b.get_config_value(&AmazonS3ConfigKey::Endpoint),
                b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)),
                "AWS_ALLOW_HTTP",
            )?;
            redacting(url, b.build().map_err(store_err)?)
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            for (key, v) in typed_options::<GoogleConfigKey>(url, options)? {
                b = b.with_config(key, v);
            }
            redacting(url, b.build().map_err(store_err)?)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            for (key, v) in typed_options::<AzureConfigKey>(url, options)? {
                b = b.with_config(key, v);
            }
            let emulator = b
                .get_config_value(&AzureConfigKey::UseEmulator)
                .is_some_and(|v| is_truthy(&v));
            if !emulator {
                check_http(
                    url,
                    b.get_config_value(&AzureConfigKey::Endpoint),
                    b.get_config_value(&AzureConfigKey::Client(ClientConfigKey::AllowHttp)),
                    "AZURE_ALLOW_HTTP",
                )?;
            }
            redacting(url, b.build().map_err(store_err)?)
        }
        _ => {
            return Err(LocationError::Unsupported {
                location: redacted(url),
            });
        }
    };
    Ok(store)
}

/// Checks that every option is a config key of the store for `url`'s
/// scheme (local files and memory take none), without building a client:
/// what `graphloom ontology check` runs on a spec's storage options.
pub fn check_options(url: &Url, options: &BTreeMap<String, String>) -> Result<()> {
    if url.scheme() == "memory" {
        return Ok(());
    }
    let (scheme, _) = ObjectStoreScheme::parse(url).map_err(|_| LocationError::Unsupported {
        location: redacted(url),
    })?;
    match scheme {
        ObjectStoreScheme::AmazonS3 => typed_options::<AmazonS3ConfigKey>(url, options).map(drop),
        ObjectStoreScheme::GoogleCloudStorage => {
            typed_options::<GoogleConfigKey>(url, options).map(drop)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            typed_options::<AzureConfigKey>(url, options).map(drop)
        }
        // Local files and memory ignore storage options; naming one is
        // harmless (a spec may move between a bucket and a folder).
        _ => Ok(()),
    }
}

/// Parses option names into the config keys of one store.
fn typed_options<K: std::str::FromStr>(
    url: &Url,
    options: &BTreeMap<String, String>,
) -> Result<Vec<(K, String)>> {
    options
        .iter()
        .map(|(k, v)| {
            k.to_ascii_lowercase()
                .parse::<K>()
                .map(|key| (key, v.clone()))
                .map_err(|_| LocationError::UnknownOption {
                    key: k.clone(),
                    scheme: url.scheme().to_string(),
                })
        })
        .collect()
}

fn is_truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

fn check_http(
    url: &Url,
    endpoint: Option<String>,
    allow_http: Option<String>,
    env: &'static str,
) -> Result<()> {
    match endpoint {
        Some(endpoint)
            if endpoint.trim().to_ascii_lowercase().starts_with("http://")
                && !allow_http.as_deref().is_some_and(is_truthy) =>
        {
            Err(LocationError::HttpNotAllowed {
                location: redacted(url),
                endpoint: endpoint_shown(&endpoint),
                env,
            })
        }
        _ => Ok(()),
    }
}

/// An endpoint for messages: scheme, host and port only.
fn endpoint_shown(endpoint: &str) -> String {
    match Url::parse(endpoint.trim()) {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port().map(|p| format!(":{p}")).unwrap_or_default()
        ),
        Err(_) => "an unparsable URL".to_string(),
    }
}

fn redacting(url: &Url, inner: impl ObjectStore) -> Arc<dyn ObjectStore> {
    Arc::new(Redacted {
        name: format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default()),
        inner: Arc::new(inner),
    })
}

/// A cloud client whose `Debug` and `Display` show only the scheme and
/// bucket. object_store's clients print their whole configuration
/// (including the access key id) when formatted with `{:?}`, and the
/// libraries that receive a client log it at debug level.
struct Redacted {
    name: String,
    inner: Arc<dyn ObjectStore>,
}

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectStore({})", self.name)
    }
}

impl std::fmt::Display for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectStore({})", self.name)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Redacted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// The URL without user info or query string, which may carry credentials
/// (`https://user:pass@host`, SAS tokens): the only form that goes into
/// messages and tables.
pub fn redacted(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.to_string()
}

/// The object-store path of a URL (its path without the leading `/`).
pub fn path_of(url: &Url) -> object_store::path::Path {
    let path = url.path().trim_start_matches('/');
    object_store::path::Path::from_url_path(path)
        .unwrap_or_else(|_| object_store::path::Path::from(path))
}

/// A setup mistake a failed request reveals, told apart so the user gets
/// one line saying what to fix instead of the server's XML body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The bucket or container does not exist.
    NoBucket,
    /// The server refused the credentials (or there were none).
    AccessDenied,
    /// Nothing answered at the endpoint.
    Unreachable,
}

impl Problem {
    /// Reads the error and its sources. `None` when it is none of the
    /// known setup mistakes (the caller keeps the full error then).
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Option<Problem> {
        let mut texts = String::new();
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
        // Error chains are short; the bound only guards against a cycle.
        for _ in 0..32 {
            let Some(e) = next else { break };
            texts.push_str(&e.to_string());
            texts.push('\n');
            next = e.source();
        }
        let has = |needles: &[&str]| needles.iter().any(|n| texts.contains(n));
        if has(&[
            "NoSuchBucket",
            "ContainerNotFound",
            "The specified bucket does not exist",
            "The specified container does not exist",
        ]) {
            Some(Problem::NoBucket)
        } else if has(&[
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
            "AuthenticationFailed",
            "AuthorizationFailure",
            "403 Forbidden",
        ]) {
            Some(Problem::AccessDenied)
        } else if has(&[
            "Connection refused",
            "dns error",
            "failed to lookup address",
            "error trying to connect",
        ]) {
            Some(Problem::Unreachable)
        } else {
            None
        }
    }

    /// One line for `location` (a URL inside the bucket) saying what to fix.
    pub fn describe(self, location: &Url) -> String {
        let bucket = location.host_str().unwrap_or_default();
        match self {
            Problem::NoBucket => format!(
                "bucket or container `{bucket}` of {} does not exist: create it, or fix the URL (or the endpoint in storage_options)",
                redacted(location)
            ),
            Problem::AccessDenied => format!(
                "the object store refused the credentials for {}: check the key in the environment (AWS_*, AZURE_*, GOOGLE_*) or storage_options",
                redacted(location)
            ),
            Problem::Unreachable => format!(
                "cannot reach the object store for {}: nothing answered at its endpoint (check aws_endpoint / azure_storage_endpoint and that the server runs)",
                redacted(location)
            ),
        }
    }
}
