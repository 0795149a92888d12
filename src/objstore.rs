//! Object store access shared by the source and store stages: turning the
//! URLs users write into [`Url`]s and building the matching `object_store`
//! client (local files, memory, S3, GCS, Azure) with options from the
//! environment and the spec.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreScheme};
use url::Url;

/// Errors raised while resolving a location or building its client.
#[derive(Debug, thiserror::Error)]
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
        location: url.to_string(),
    })?;
    let store_err = |source| LocationError::Store {
        location: redacted(url),
        source,
    };
    let unknown = |key: &str| LocationError::UnknownOption {
        key: key.to_string(),
        scheme: url.scheme().to_string(),
    };
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::Local => Arc::new(LocalFileSystem::new()),
        ObjectStoreScheme::Memory => memory_store(url),
        ObjectStoreScheme::AmazonS3 => {
            let mut b = AmazonS3Builder::from_env().with_url(url.as_str());
            for (k, v) in options {
                let key: AmazonS3ConfigKey =
                    k.to_ascii_lowercase().parse().map_err(|_| unknown(k))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(store_err)?)
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            for (k, v) in options {
                let key: GoogleConfigKey =
                    k.to_ascii_lowercase().parse().map_err(|_| unknown(k))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(store_err)?)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            for (k, v) in options {
                let key: AzureConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown(k))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(store_err)?)
        }
        _ => {
            return Err(LocationError::Unsupported {
                location: redacted(url),
            });
        }
    };
    Ok(store)
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
