//! sqllogictest files under `tests/slt/` run against a graph loaded with the
//! example facts. A query written as `@file sql/NAME.sql` runs that file, so
//! the worked queries in `sql/` are checked as they are shipped.
//!
//! `GRAPHLOOM_SLT_COMPLETE=1 cargo test --test it slt` rewrites the expected
//! results from the current output (review the diff before committing).

use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::DataType;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use async_trait::async_trait;
use graphloom::query::{GraphSession, QueryError};
use sqllogictest::{DBOutput, DefaultColumnType};

use crate::common;

/// A sqllogictest connection: one read-only graph session.
struct GraphDb {
    session: Arc<GraphSession>,
}

#[async_trait]
impl sqllogictest::AsyncDB for GraphDb {
    type Error = QueryError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, QueryError> {
        let text = match sql.trim().strip_prefix("@file ") {
            Some(path) => {
                let path = common::repo().join(path.trim());
                std::fs::read_to_string(&path).map_err(|source| QueryError::File {
                    path: path.display().to_string(),
                    source,
                })?
            }
            None => sql.to_string(),
        };
        let mut results = self.session.run(&text).await?;
        let Some(last) = results.pop() else {
            return Ok(DBOutput::StatementComplete(0));
        };
        let types = last
            .schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                    DefaultColumnType::Integer
                }
                DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
                    DefaultColumnType::Integer
                }
                DataType::Float32 | DataType::Float64 => DefaultColumnType::FloatingPoint,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                    DefaultColumnType::Text
                }
                _ => DefaultColumnType::Any,
            })
            .collect();
        let options = FormatOptions::default().with_null("NULL");
        let mut rows = Vec::new();
        for batch in &last.batches {
            let formatters = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| QueryError::Format(e.into()))?;
            for row in 0..batch.num_rows() {
                rows.push(
                    formatters
                        .iter()
                        .map(|f| {
                            let v = f.value(row).to_string();
                            if v.is_empty() {
                                "(empty)".to_string()
                            } else {
                                v
                            }
                        })
                        .collect(),
                );
            }
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "graphloom"
    }

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await;
    }
}

fn slt_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(common::repo().join("tests/slt"))
        .expect("tests/slt exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_logic_tests_pass_on_the_example_facts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::procurement_graph(dir.path()).await;
    let session = Arc::new(GraphSession::open(&store).await.expect("open session"));
    let complete = std::env::var("GRAPHLOOM_SLT_COMPLETE").is_ok_and(|v| v == "1");
    let failures = run_files(session, complete).await;
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Runs every file under `tests/slt` against `session` (or rewrites their
/// expected results when `complete`) and returns the failures.
pub async fn run_files(session: Arc<GraphSession>, complete: bool) -> Vec<String> {
    let files = slt_files();
    assert!(
        files.len() >= 3,
        "expected the slt files under tests/slt, found {files:?}"
    );
    let mut failures = Vec::new();
    for file in &files {
        let session = session.clone();
        let mut runner = sqllogictest::Runner::new(move || {
            let session = session.clone();
            async move { Ok(GraphDb { session }) }
        });
        if complete {
            runner
                .update_test_file(
                    file,
                    " ",
                    sqllogictest::default_validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::default_column_validator,
                )
                .await
                .unwrap_or_else(|e| panic!("cannot complete {}: {e}", file.display()));
        } else if let Err(e) = runner.run_file_async(file).await {
            failures.push(format!("{}:\n{e}", file.display()));
        }
    }
    failures
}
