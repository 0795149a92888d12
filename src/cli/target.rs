//! How a command is told which spec and which graph it works on, shared by
//! every command: `--pipeline PATH` everywhere a spec is read (the older
//! positional form still works where it did), `--graph URL` where a graph
//! can be named directly.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use graphloom::Error;
use graphloom::ontology::Ontology;
use graphloom::spec::PipelineSpec;
use graphloom::store::GraphStore;

use super::UsageError;

/// The pipeline spec of a command that needs one: `--pipeline PATH`, or as
/// the first argument (the older form, left out of the help); giving both
/// is a usage error.
#[derive(Debug, Args)]
pub struct SpecArg {
    /// Pipeline spec (TOML).
    #[arg(long, value_name = "PATH", required_unless_present = "spec")]
    pipeline: Option<PathBuf>,
    /// The spec as the first argument, the older form of --pipeline.
    #[arg(value_name = "PIPELINE", hide = true)]
    spec: Option<PathBuf>,
}

impl SpecArg {
    /// The spec's path, however it was given; both ways at once is a
    /// usage error.
    pub fn path(&self) -> Result<&Path, UsageError> {
        match (&self.pipeline, &self.spec) {
            (Some(flag), Some(arg)) => Err(twice(flag, arg)),
            (Some(path), None) | (None, Some(path)) => Ok(path),
            (None, None) => unreachable!("clap requires --pipeline or PIPELINE"),
        }
    }

    /// The spec's path and the one positional argument after it, for a
    /// command whose own argument follows the spec (`add PIPELINE FILE`):
    /// with `--pipeline`, the first positional argument is the command's.
    pub fn path_and<'a>(
        &'a self,
        next: Option<&'a str>,
    ) -> Result<(&'a Path, &'a str), UsageError> {
        match (&self.pipeline, &self.spec, next) {
            (Some(flag), Some(arg), Some(_)) => Err(twice(flag, arg)),
            (Some(path), Some(arg), None) => arg
                .to_str()
                .map(|a| (path.as_path(), a))
                .ok_or_else(|| UsageError(format!("`{}` is not UTF-8", arg.display()))),
            (Some(path), None, Some(next)) | (None, Some(path), Some(next)) => Ok((path, next)),
            (None, None, Some(_)) => unreachable!("clap requires --pipeline or PIPELINE"),
            (_, _, None) => Err(UsageError(
                "the following required argument was not provided: <FILE>".into(),
            )),
        }
    }
}

/// The usage error of a spec given both as `--pipeline` and by position.
fn twice(flag: &Path, arg: &Path) -> UsageError {
    UsageError(format!(
        "the pipeline spec is given twice, as --pipeline {} and as the argument {}: give it once, as --pipeline PATH",
        flag.display(),
        arg.display()
    ))
}

/// Reads the spec at `path` and compiles its ontology.
pub fn load(path: &Path) -> Result<(PipelineSpec, Ontology), Error> {
    let spec = PipelineSpec::from_path(path)?;
    let ontology = Ontology::try_from(&spec.ontology)?;
    Ok((spec, ontology))
}

/// The spec of a command that writes the spec's graph, and the graph to
/// write instead.
#[derive(Debug, Args)]
pub struct SpecTarget {
    #[command(flatten)]
    pub spec: SpecArg,
    /// Use this graph instead of the spec's output.graph.
    #[arg(long, value_name = "URL")]
    pub graph: Option<String>,
}

impl SpecTarget {
    /// The graph the spec names, or the one `--graph` names instead, with
    /// the spec's storage options and lock timeout.
    pub fn open(&self, spec: &PipelineSpec) -> Result<GraphStore, Error> {
        open_output(spec, self.graph.as_deref())
    }
}

/// Which graph a read command opens.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct GraphTarget {
    /// Root URL of the graph (file://, memory://, s3://, gs://, az:// or a path).
    #[arg(long, value_name = "URL")]
    graph: Option<String>,
    /// Take the graph (and its storage options) from a pipeline spec.
    #[arg(long, value_name = "PATH")]
    pipeline: Option<PathBuf>,
}

impl GraphTarget {
    /// The target of a command that parses its own `--graph` and
    /// `--pipeline` (one of them given).
    pub fn new(graph: Option<String>, pipeline: Option<PathBuf>) -> Self {
        GraphTarget { graph, pipeline }
    }

    /// Opens the graph.
    pub fn open(&self) -> Result<GraphStore, Error> {
        Ok(self.open_with_spec()?.0)
    }

    /// Opens the graph, and returns the spec too when the graph was named
    /// by one (`--pipeline`): its other settings apply to the command.
    pub fn open_with_spec(&self) -> Result<(GraphStore, Option<PipelineSpec>), Error> {
        match (&self.graph, &self.pipeline) {
            (Some(url), _) => Ok((GraphStore::open(url, &Default::default())?, None)),
            (None, Some(path)) => {
                let spec = PipelineSpec::from_path(path)?;
                Ok((open_output(&spec, None)?, Some(spec)))
            }
            (None, None) => unreachable!("clap requires --graph or --pipeline"),
        }
    }
}

/// The spec's output graph, or `graph` instead.
fn open_output(spec: &PipelineSpec, graph: Option<&str>) -> Result<GraphStore, Error> {
    let url = graph.unwrap_or(&spec.output.graph);
    Ok(GraphStore::open(url, &spec.output.storage_options)?
        .with_lock_stale_after(Duration::from_secs(spec.output.lock_stale_after_secs)))
}
