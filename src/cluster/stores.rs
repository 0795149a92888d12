//! Object stores for cluster processes, made on first use from the
//! process's environment, as every other graphloom command makes them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreRegistry;
use object_store::ObjectStore;
use url::Url;

/// A registry that builds the client for `scheme://bucket` the first time
/// a plan reads from it, with [`crate::objstore::store_for`] (credentials
/// and endpoints from `AWS_*`, `AZURE_*`, `GOOGLE_*`).
#[derive(Debug, Default)]
pub(super) struct EnvObjectStores {
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

/// `scheme://host:port`, the part of a URL one store serves.
fn key(url: &Url) -> String {
    format!(
        "{}://{}",
        url.scheme(),
        &url[url::Position::BeforeHost..url::Position::AfterPort]
    )
}

impl ObjectStoreRegistry for EnvObjectStores {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        stores.insert(key(url), store)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        let key = key(url);
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(store) = stores.get(&key) {
            return Ok(store.clone());
        }
        let root = Url::parse(&format!("{key}/"))
            .map_err(|e| DataFusionError::Plan(format!("object store URL {key}: {e}")))?;
        let store = crate::objstore::store_for(&root, &BTreeMap::new())
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        stores.insert(key, store.clone());
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_are_made_once_per_bucket_and_unknown_schemes_are_refused() {
        let stores = EnvObjectStores::default();
        let a = stores
            .get_store(&Url::parse("file:///tmp/g/nodes/part-1.parquet").expect("url"))
            .expect("local files");
        let b = stores
            .get_store(&Url::parse("file:///other/x.parquet").expect("url"))
            .expect("local files");
        assert!(Arc::ptr_eq(&a, &b), "one local store");
        let err = stores
            .get_store(&Url::parse("ftp://host/x.parquet").expect("url"))
            .expect_err("no ftp store");
        assert!(err.to_string().contains("ftp://host"), "{err}");
    }
}
