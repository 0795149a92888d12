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
//! * [`llm`]: the rate-limited, retrying, caching LLM client;
//! * [`extract`] and [`classify`]: entity and fact extraction, subtype walks;
//! * [`mapping`]: structured records mapped to entities and facts by rules;
//! * [`resolve`]: matching mentions to nodes and facts to edges;
//! * [`store`]: the graph's Delta tables and the commit protocol;
//! * [`query`]: a DataFusion session over the graph with label functions.
//!
//! [`cluster`] runs the same plans on Apache DataFusion Ballista.
//! [`run`] and [`add`] orchestrate the commands that write a graph;
//! [`eval`] scores one, [`export`] copies its snapshot as plain Parquet.
//! Leaves shared by all: [`stage`] (stage names), [`rows`] (table rows),
//! [`text`] (name normalisation), [`cues`] (every rule that reads English
//! wording, by name), [`scratch`] (DataFusion scratch tables),
//! [`objstore`] (URLs and object store clients), [`portable`] (functions
//! that carry their settings) and [`values`] (property values and fact
//! times).

pub mod add;
#[cfg(feature = "testkit")]
pub mod bench;
pub mod classify;
pub mod cluster;
pub mod communities;
pub mod cues;
pub mod eval;
pub mod export;
pub mod extract;
pub mod llm;
pub mod mapping;
pub mod objstore;
pub mod ontology;
pub mod pages;
pub mod portable;
pub mod query;
pub mod resolve;
pub mod rows;
pub mod run;
pub mod scratch;
pub mod source;
pub mod spec;
pub mod stage;
pub mod store;
pub mod text;
pub mod values;

/// Errors of any layer, as the command line reports them. Layers with
/// large errors are boxed so that `Result<T, Error>` stays small.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    #[error(transparent)]
    Ontology(#[from] ontology::OntologyError),
    #[error(transparent)]
    Location(#[from] objstore::LocationError),
    #[error(transparent)]
    Mapping(#[from] mapping::MappingError),
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
    #[error(transparent)]
    Batch(Box<llm::batch::BatchError>),
    #[error(transparent)]
    Page(Box<pages::PageError>),
    #[error(transparent)]
    Communities(Box<communities::CommunityError>),
    #[error(transparent)]
    Cluster(Box<cluster::ClusterError>),
}

/// `From` for the boxed variants, so `?` works from every layer.
macro_rules! from_boxed {
    ($($variant:ident($error:ty)),* $(,)?) => {$(
        impl From<$error> for Error {
            fn from(e: $error) -> Self {
                Error::$variant(Box::new(e))
            }
        }
    )*};
}

from_boxed!(
    Store(store::StoreError),
    Query(query::QueryError),
    Add(add::AddError),
    Llm(llm::LlmError),
    Run(run::RunError),
    Eval(eval::EvalError),
    Export(export::ExportError),
    Batch(llm::batch::BatchError),
    Page(pages::PageError),
    Communities(communities::CommunityError),
    Cluster(cluster::ClusterError),
);

#[cfg(feature = "testkit")]
from_boxed!(Bench(bench::resolution::BenchError));

impl Error {
    /// The process exit code: 2 when the user fixes the command or its
    /// input (the spec, the ontology, a URL or storage option, a missing
    /// bucket or refused credentials, a path with no graph, SQL text, an
    /// unreadable input or gold file), 1 for a failure while running (an
    /// LLM, the machine, a server that is down). The one place that
    /// decides; layers only say what went wrong.
    pub fn exit_code(&self) -> u8 {
        if self.is_usage() { 2 } else { 1 }
    }

    fn is_usage(&self) -> bool {
        use datafusion::error::DataFusionError as Df;
        use objstore::Problem;
        // An endpoint nobody answers at may be a server that is down.
        let problem = |p: &Problem| *p != Problem::Unreachable;
        let store = |e: &store::StoreError| match e {
            store::StoreError::Location(_) | store::StoreError::NoGraph { .. } => true,
            store::StoreError::Storage { problem: p, .. } => problem(p),
            _ => false,
        };
        let source = |e: &source::SourceError| match e {
            source::SourceError::Location(_) | source::SourceError::Missing { .. } => true,
            source::SourceError::Storage { problem: p, .. } => problem(p),
            _ => false,
        };
        let query = |e: &query::QueryError| match e {
            query::QueryError::ReadOnly(_)
            | query::QueryError::Empty
            | query::QueryError::File { .. } => true,
            // Errors in the SQL text itself.
            query::QueryError::DataFusion(e) => matches!(
                e.find_root(),
                Df::SQL(..) | Df::Plan(_) | Df::SchemaError(..)
            ),
            query::QueryError::Store(e) => store(e),
            _ => false,
        };
        match self {
            Error::Spec(_) | Error::Ontology(_) | Error::Location(_) | Error::Mapping(_) => true,
            Error::Store(e) => store(e),
            Error::Query(e) => query(e),
            Error::Add(e) => match &**e {
                add::AddError::Read { .. } => true,
                add::AddError::Store(e) => store(e),
                _ => false,
            },
            Error::Export(e) => match &**e {
                export::ExportError::Location(_) => true,
                export::ExportError::Store(e) => store(e),
                _ => false,
            },
            Error::Eval(e) => match &**e {
                eval::EvalError::Gold { .. } => true,
                eval::EvalError::Store(e) => store(e),
            },
            Error::Run(e) => match &**e {
                run::RunError::NoSource
                | run::RunError::Location(_)
                | run::RunError::Mapping(_)
                | run::RunError::BatchNeedsCache
                | run::RunError::NoWaitNeedsBatch => true,
                run::RunError::Source(e) => source(e),
                run::RunError::Store(e) => store(e),
                run::RunError::Cluster(e) | run::RunError::ClusterSetting(e) => e.is_usage(),
                _ => false,
            },
            Error::Page(e) => match &**e {
                pages::PageError::ViewQuery(_) | pages::PageError::AsOf { .. } => true,
                pages::PageError::Query { source, .. } => query(source),
                pages::PageError::Store(e) => store(e),
                pages::PageError::Eval(e) => matches!(**e, eval::EvalError::Gold { .. }),
                pages::PageError::Write { .. } => true,
            },
            Error::Communities(e) => match &**e {
                communities::CommunityError::Store(e) => store(e),
                _ => false,
            },
            Error::Cluster(e) => match &**e {
                cluster::ClusterError::Query(e) => query(e),
                e => e.is_usage(),
            },
            Error::Llm(_) | Error::Batch(_) => false,
            #[cfg(feature = "testkit")]
            Error::Bench(_) => false,
        }
    }
}

/// Result alias across layers.
pub type Result<T, E = Error> = std::result::Result<T, E>;
