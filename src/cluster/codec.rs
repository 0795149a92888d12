//! The plan codecs of graphloom's cluster processes: Ballista's own codecs
//! plus graphloom's SQL functions, whose data (type closures) travels in
//! the plan as each call's function definition.
//!
//! A function DataFusion serializes by name alone would need a copy of the
//! graph's ontology on every executor, registered before the query; with
//! the data in the plan, a scheduler and its executors serve any graph.
//! Client, scheduler and executors must all use these codecs.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

/// Marks a function written as a [`crate::portable`] family and state
/// (anything else graphloom writes is a query function's JSON).
const PORTABLE: &[u8] = b"graphloom-portable\0";

/// The function's data, if it is one of graphloom's functions: a portable
/// function's family and settings, or a query function's state.
fn encode_function(udf: &ScalarUDF) -> Option<Vec<u8>> {
    if let Some((family, state)) = crate::portable::state_of(udf) {
        let mut out = PORTABLE.to_vec();
        out.extend_from_slice(family.as_bytes());
        out.push(0);
        out.extend_from_slice(state);
        return Some(out);
    }
    crate::query::function_state(udf)
}

/// The functions a portable family rebuilds from its settings, with the
/// family's name (rebuilt functions are wrapped again, so a scheduler
/// passes them on to executors as it got them).
fn family_functions(family: &str, state: &[u8]) -> Option<(&'static str, Vec<ScalarUDF>)> {
    use crate::resolve::{embedding, linkage, udfs};
    match family {
        udfs::FUNCTION_FAMILY => Some((udfs::FUNCTION_FAMILY, udfs::functions_from_state(state)?)),
        embedding::FUNCTION_FAMILY => Some((
            embedding::FUNCTION_FAMILY,
            embedding::functions_from_state(state)?,
        )),
        linkage::PAIR_FUNCTION_FAMILY => Some((
            linkage::PAIR_FUNCTION_FAMILY,
            linkage::pair_functions_from_state(state)?,
        )),
        _ => None,
    }
}

/// Appends a graphloom function's data to `buf`; `false` (and nothing
/// written) for any other function. Both codecs encode calls this way.
fn write_function(udf: &ScalarUDF, buf: &mut Vec<u8>) -> bool {
    match encode_function(udf) {
        Some(state) => {
            buf.extend_from_slice(&state);
            true
        }
        None => false,
    }
}

/// Rebuilds a graphloom function named `name` from `buf`, or `None` when
/// `buf` is not a graphloom function's data.
fn decode_function(name: &str, buf: &[u8]) -> Option<Result<Arc<ScalarUDF>>> {
    if buf.is_empty() {
        return None;
    }
    if let Some(rest) = buf.strip_prefix(PORTABLE) {
        let split = rest.iter().position(|b| *b == 0)?;
        let family = std::str::from_utf8(&rest[..split]).ok()?;
        let state = &rest[split + 1..];
        let found = family_functions(family, state).ok_or_else(|| {
            DataFusionError::Internal(format!(
                "cannot rebuild `{name}`: unknown function family `{family}` or settings this graphloom cannot read (are all cluster processes the same version?)"
            ))
        });
        return Some(found.and_then(|(family, all)| {
            all.into_iter()
                .find(|f| f.name() == name)
                .map(|f| Arc::new(crate::portable::wrap(f, family, state.into())))
                .ok_or_else(|| {
                    DataFusionError::Internal(format!(
                        "function family `{family}` has no function `{name}`"
                    ))
                })
        }));
    }
    let udf = crate::query::function_from_state(buf)?;
    if udf.name() != name {
        return Some(Err(DataFusionError::Internal(format!(
            "the plan calls `{name}` with the definition of `{}`",
            udf.name()
        ))));
    }
    Some(Ok(Arc::new(udf)))
}

/// Ballista's logical codec plus graphloom's functions.
#[derive(Debug, Default)]
pub struct LogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        self.inner
            .try_decode_table_provider(buf, table_ref, schema, ctx)
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        decode_function(name, buf).unwrap_or_else(|| self.inner.try_decode_udf(name, buf))
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if write_function(node, buf) {
            Ok(())
        } else {
            self.inner.try_encode_udf(node, buf)
        }
    }
}

/// Ballista's physical codec plus graphloom's functions.
#[derive(Debug, Default)]
pub struct PhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.inner.try_decode(buf, inputs, ctx, proto_converter)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        self.inner.try_encode(node, buf, proto_converter)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        decode_function(name, buf).unwrap_or_else(|| self.inner.try_decode_udf(name, buf))
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if write_function(node, buf) {
            Ok(())
        } else {
            self.inner.try_encode_udf(node, buf)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::FunctionRegistry;
    use std::collections::{BTreeMap, BTreeSet};

    use datafusion::prelude::SessionContext;

    /// A session with the query functions, `Contract` → `MSA` as the
    /// entity closure.
    fn session() -> SessionContext {
        let ctx = SessionContext::new();
        let entity = BTreeMap::from([(
            "Contract".to_string(),
            BTreeSet::from(["Contract".to_string(), "MSA".to_string()]),
        )]);
        crate::query::register_functions(&ctx, entity, BTreeMap::new());
        ctx
    }

    #[tokio::test]
    async fn a_logical_plan_calling_graphloom_functions_decodes_in_a_session_without_them() {
        let ctx = session();
        let plan = ctx
            .sql(
                // The type name is a column: with a literal the planner
                // rewrites the call into an IN list, and no function is left.
                "SELECT entity_type_matches(t, w) AS m, has_label(l, 'MSA') AS h \
                 FROM (VALUES ('MSA', ['Contract', 'MSA'], 'Contract'), \
                 ('Person', ['Person'], 'Contract')) AS v(t, l, w)",
            )
            .await
            .expect("plan")
            .into_optimized_plan()
            .expect("optimized");
        let codec = LogicalCodec::default();
        let bytes =
            datafusion_proto::bytes::logical_plan_to_bytes_with_extension_codec(&plan, &codec)
                .expect("encode");
        // A bare session: the functions exist only in the plan's bytes.
        let bare = SessionContext::new();
        let decoded = datafusion_proto::bytes::logical_plan_from_bytes_with_extension_codec(
            &bytes,
            &bare.task_ctx(),
            &codec,
        )
        .expect("decode");
        let batches = bare
            .execute_logical_plan(decoded)
            .await
            .expect("execute")
            .collect()
            .await
            .expect("collect");
        let rows: Vec<(bool, bool)> = batches
            .iter()
            .flat_map(|b| {
                use arrow::array::AsArray;
                let (m, h) = (b.column(0).as_boolean(), b.column(1).as_boolean());
                (0..b.num_rows())
                    .map(|i| (m.value(i), h.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(rows, vec![(true, true), (false, false)]);
        // Without graphloom's codec the same bytes cannot be decoded.
        let plain = datafusion_proto::logical_plan::DefaultLogicalExtensionCodec {};
        assert!(
            datafusion_proto::bytes::logical_plan_from_bytes_with_extension_codec(
                &bytes,
                &bare.task_ctx(),
                &plain,
            )
            .is_err()
        );
    }

    #[test]
    fn a_definition_under_another_name_is_refused() {
        let ctx = session();
        let udf = ctx.udf("entity_type_matches").expect("registered");
        let state = encode_function(&udf).expect("a graphloom function");
        let err = decode_function("edge_type_matches", &state)
            .expect("graphloom data")
            .expect_err("name mismatch");
        assert!(err.to_string().contains("edge_type_matches"), "{err}");
        assert!(decode_function("abs", &[]).is_none());
        assert!(decode_function("abs", b"not json").is_none());
    }
}
