//! graphloom turns archives of episodes (messages, document chunks, JSON
//! records) into a temporal knowledge graph stored as Delta Lake tables.
//!
//! The modules follow the data flow of a run, so each stage lives in the
//! module named after it:
//!
//! * [`spec`]: the pipeline spec (TOML) and its checks;
//! * [`ontology`]: entity and edge types, hierarchies and their rules;
//! * [`source`]: discovering and parsing episode files into episodes with
//!   content-hash ids;
//! * [`add`]: loading known nodes and facts without an LLM;
//! * [`resolve`]: matching mentions to nodes (name normalisation so far);
//! * [`store`]: the graph's Delta tables and the commit protocol;
//! * [`query`]: a DataFusion session over the graph with label functions;
//! * [`export`]: the graph's snapshot as plain Parquet for non-Delta readers.
//!
//! [`objstore`] is shared plumbing: URLs and object store clients;
//! [`values`] checks property values and normalises fact times.

pub mod add;
#[cfg(feature = "testkit")]
pub mod bench;
pub mod classify;
pub mod eval;
pub mod export;
pub mod extract;
pub mod llm;
pub mod objstore;
pub mod ontology;
pub mod query;
pub mod resolve;
pub mod rows;
pub mod run;
pub mod scratch;
pub mod source;
pub mod spec;
pub mod store;
pub mod text;
pub mod values;

/// Errors of any layer, as the command line reports them. Layers with
/// large errors are boxed so that `Result<T, Error>` stays small.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    #[error(transparent)]
    Ontology(#[from] ontology::OntologyError),
    #[error(transparent)]
    Location(#[from] objstore::LocationError),
    #[error(transparent)]
    Store(Box<store::StoreError>),
    #[error(transparent)]
    Query(Box<query::QueryError>),
    #[error(transparent)]
    Add(Box<add::AddError>),
    #[error(transparent)]
    Llm(Box<llm::LlmError>),
    #[error(transparent)]
    Run(Box<run::RunError>),
    #[error(transparent)]
    Eval(Box<eval::EvalError>),
    #[cfg(feature = "testkit")]
    #[error(transparent)]
    Bench(Box<bench::resolution::BenchError>),
    #[error(transparent)]
    Export(Box<export::ExportError>),
}

impl From<export::ExportError> for Error {
    fn from(e: export::ExportError) -> Self {
        Error::Export(Box::new(e))
    }
}

#[cfg(feature = "testkit")]
impl From<bench::resolution::BenchError> for Error {
    fn from(e: bench::resolution::BenchError) -> Self {
        Error::Bench(Box::new(e))
    }
}

impl From<eval::EvalError> for Error {
    fn from(e: eval::EvalError) -> Self {
        Error::Eval(Box::new(e))
    }
}

impl From<run::RunError> for Error {
    fn from(e: run::RunError) -> Self {
        Error::Run(Box::new(e))
    }
}

impl From<llm::LlmError> for Error {
    fn from(e: llm::LlmError) -> Self {
        Error::Llm(Box::new(e))
    }
}

impl From<store::StoreError> for Error {
    fn from(e: store::StoreError) -> Self {
        Error::Store(Box::new(e))
    }
}

impl From<query::QueryError> for Error {
    fn from(e: query::QueryError) -> Self {
        Error::Query(Box::new(e))
    }
}

impl From<add::AddError> for Error {
    fn from(e: add::AddError) -> Self {
        Error::Add(Box::new(e))
    }
}

impl Error {
    /// Whether the error is the user's input (spec, ontology, location, SQL
    /// text) rather than a failure while running; the CLI exits with 2 for
    /// these and 1 for the rest.
    pub fn is_usage(&self) -> bool {
        match self {
            Error::Spec(_) | Error::Ontology(_) | Error::Location(_) => true,
            Error::Store(e) => e.is_usage(),
            Error::Query(q) => q.is_usage(),
            Error::Add(a) => a.is_usage(),
            Error::Llm(_) => false,
            #[cfg(feature = "testkit")]
            Error::Bench(_) => false,
            Error::Export(e) => e.is_usage(),
            Error::Eval(e) => match &**e {
                eval::EvalError::Gold { .. } => true,
                eval::EvalError::Store(s) => s.is_usage(),
            },
            Error::Run(e) => match &**e {
                run::RunError::NoSource | run::RunError::Location(_) => true,
                run::RunError::Source(s) => s.is_usage(),
                run::RunError::Store(s) => s.is_usage(),
                _ => false,
            },
        }
    }
}

/// Result alias across layers.
pub type Result<T, E = Error> = std::result::Result<T, E>;
