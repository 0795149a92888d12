//! The scalar functions resolution's plans call, carrying their settings
//! so that plans calling them can run on other processes.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, BooleanArray, Float64Array, Int64Builder, ListBuilder, StringArray,
    StringBuilder,
};
use arrow::datatypes::DataType;
use datafusion::logical_expr::{ColumnarValue, ScalarUDF, Volatility, create_udf};
use datafusion::prelude::SessionContext;

use super::mentions::{list_of, string_lists, strings};
use super::{ResolveSpec, name_similarity};

/// The resolution UDFs, built from the settings and the identity
/// properties of each type (`type → properties`). They are plain scalar
/// functions, registrable on any `SessionContext`.
pub fn udfs(spec: &ResolveSpec, identity: &BTreeMap<String, Vec<String>>) -> Vec<ScalarUDF> {
    // One set of keys behind both functions, as nodes store them
    // (crate::text::NameKeys), so stored and computed keys agree.
    let keys = Arc::new(spec.name_keys());
    let folding = Arc::clone(&keys);
    let fold = create_udf(
        "fold_name",
        vec![DataType::Utf8],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let names = strings(&arrays[0])?;
            let out: StringArray = names
                .as_string::<i32>()
                .iter()
                .map(|n| n.map(|n| folding.folded(n)))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    );
    let stems = create_udf(
        "name_stems",
        vec![DataType::Utf8],
        list_of(DataType::Utf8),
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let names = strings(&arrays[0])?;
            let mut out = ListBuilder::new(StringBuilder::new());
            for n in names.as_string::<i32>().iter() {
                for stem in n.map(crate::text::name_stems).unwrap_or_default() {
                    out.values().append_value(stem);
                }
                out.append(true);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }),
    );
    let name_bands = create_udf(
        "name_bands",
        vec![DataType::Utf8, DataType::Utf8],
        list_of(DataType::Int64),
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (groups, names) = (strings(&arrays[0])?, strings(&arrays[1])?);
            let mut out = ListBuilder::new(Int64Builder::new());
            for (g, n) in groups
                .as_string::<i32>()
                .iter()
                .zip(names.as_string::<i32>().iter())
            {
                if let (Some(g), Some(n)) = (g, n) {
                    out.values().append_slice(&keys.band_keys(g, n));
                }
                out.append(true);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }),
    );
    let similarity = create_udf(
        "name_similarity",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Float64,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (a, b) = (strings(&arrays[0])?, strings(&arrays[1])?);
            let out: Float64Array = a
                .as_string::<i32>()
                .iter()
                .zip(b.as_string::<i32>().iter())
                .map(|(a, b)| Some(name_similarity(a?, b?)))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    );
    let compatible = create_udf(
        "chains_compatible",
        vec![list_of(DataType::Utf8), list_of(DataType::Utf8)],
        DataType::Boolean,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (a, b) = (string_lists(&arrays[0])?, string_lists(&arrays[1])?);
            let (a, b) = (a.as_list::<i32>(), b.as_list::<i32>());
            let out: BooleanArray = (0..a.len())
                .map(|i| {
                    if a.is_null(i) || b.is_null(i) {
                        return None;
                    }
                    let (x, y) = (a.value(i), b.value(i));
                    let (x, y) = (x.as_string::<i32>(), y.as_string::<i32>());
                    let n = x.len().min(y.len());
                    Some((0..n).all(|k| x.value(k) == y.value(k)))
                })
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        }),
    );
    // The same keys nodes store (crate::store::identity_key_columns).
    let identity = Arc::new(crate::text::IdentityKeys::new(identity.clone()));
    let identity_keys = create_udf(
        "identity_keys",
        vec![DataType::Utf8, DataType::Utf8],
        list_of(DataType::Utf8),
        Volatility::Immutable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (types, attrs) = (strings(&arrays[0])?, strings(&arrays[1])?);
            let mut out = ListBuilder::new(StringBuilder::new());
            for (t, a) in types
                .as_string::<i32>()
                .iter()
                .zip(attrs.as_string::<i32>().iter())
            {
                if let (Some(t), Some(a)) = (t, a) {
                    for k in identity.keys(t, a) {
                        out.values().append_value(k);
                    }
                }
                out.append(true);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }),
    );
    vec![
        fold,
        stems,
        name_bands,
        similarity,
        compatible,
        identity_keys,
    ]
}

/// Registers the resolution UDFs ([`udfs`]) and the record-linkage UDFs
/// that read a row's rule alone ([`super::linkage::udfs`]) on `ctx`; the
/// pair-scoring ones come with the linkage candidates. They carry their
/// settings ([`crate::portable`]), so plans calling them can run on other
/// processes ([`functions_from_state`] rebuilds them there).
pub(super) fn register_udfs(
    ctx: &SessionContext,
    spec: &ResolveSpec,
    identity: &BTreeMap<String, Vec<String>>,
) {
    // Serializing plain settings cannot fail; an empty state would only
    // make a rebuild elsewhere fail with a clear error.
    let state: Arc<[u8]> = serde_json::to_vec(&(spec, identity))
        .unwrap_or_default()
        .into();
    for f in settings_udfs(spec, identity) {
        ctx.register_udf(crate::portable::wrap(f, FUNCTION_FAMILY, state.clone()));
    }
}

/// The family name under which [`register_udfs`]'s functions carry their
/// settings.
pub const FUNCTION_FAMILY: &str = "resolve";

fn settings_udfs(spec: &ResolveSpec, identity: &BTreeMap<String, Vec<String>>) -> Vec<ScalarUDF> {
    let linkages: Vec<super::linkage::Linkage> = spec
        .linkage
        .iter()
        .map(super::linkage::Linkage::new)
        .collect();
    udfs(spec, identity)
        .into_iter()
        .chain(super::linkage::udfs(&linkages))
        .collect()
}

/// Rebuilds the functions [`register_udfs`] registers from the settings
/// they carry; `None` when `state` is not such settings.
pub fn functions_from_state(state: &[u8]) -> Option<Vec<ScalarUDF>> {
    let (spec, identity): (ResolveSpec, BTreeMap<String, Vec<String>>) =
        serde_json::from_slice(state).ok()?;
    Some(settings_udfs(&spec, &identity))
}
