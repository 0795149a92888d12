//! SQL functions that another process can rebuild. Resolution's functions
//! are closures over settings (corporate suffixes, band sizes, identity
//! properties); a function wrapped here carries those settings as bytes,
//! under the name of the family of functions they rebuild, so a plan
//! that leaves the process (a Ballista executor) can rebuild it. A leaf:
//! it knows DataFusion, nothing of what the settings mean.

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::Result;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};

/// A function and the settings its family rebuilds it from.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Portable {
    inner: ScalarUDF,
    family: &'static str,
    state: Arc<[u8]>,
}

/// Wraps `udf` so that it carries `state`, from which `family`'s builder
/// makes it again. It behaves as `udf` in every other way.
pub fn wrap(udf: ScalarUDF, family: &'static str, state: Arc<[u8]>) -> ScalarUDF {
    ScalarUDF::new_from_impl(Portable {
        inner: udf,
        family,
        state,
    })
}

/// The family and state of a wrapped function, or `None` for any other.
pub fn state_of(udf: &ScalarUDF) -> Option<(&'static str, &[u8])> {
    udf.inner()
        .downcast_ref::<Portable>()
        .map(|p| (p.family, &p.state[..]))
}

impl ScalarUDFImpl for Portable {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.inner().return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.inner().return_field_from_args(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.inner.inner().invoke_with_args(args)
    }

    // A function may rewrite itself at planning (the type filters become IN
    // lists); wrapped, it must still be offered the chance.
    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.inner.simplify(args, info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::{Volatility, create_udf};
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn a_wrapped_function_answers_as_its_inner_one_and_carries_its_state() {
        let twice = create_udf(
            "twice",
            vec![DataType::Int64],
            DataType::Int64,
            Volatility::Immutable,
            Arc::new(|args: &[ColumnarValue]| {
                let a = ColumnarValue::values_to_arrays(args)?;
                let a = arrow::compute::cast(&a[0], &DataType::Int64)?;
                let a = a
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .ok_or_else(|| datafusion::error::DataFusionError::Internal("int".into()))?;
                let out: arrow::array::Int64Array = a.iter().map(|v| v.map(|v| v * 2)).collect();
                Ok(ColumnarValue::Array(Arc::new(out)))
            }),
        );
        assert!(state_of(&twice).is_none());
        let wrapped = wrap(twice, "test", Arc::from(&b"settings"[..]));
        assert_eq!(state_of(&wrapped), Some(("test", &b"settings"[..])));
        let ctx = SessionContext::new();
        ctx.register_udf(wrapped);
        let batches = ctx
            .sql("SELECT twice(21) AS x")
            .await
            .expect("plan")
            .collect()
            .await
            .expect("run");
        let shown = arrow::util::pretty::pretty_format_batches(&batches)
            .expect("format")
            .to_string();
        assert!(shown.contains("| 42 |"), "{shown}");
    }
}
