//! `graphloom ontology check`: validate a spec's ontology and print its
//! type trees.

use clap::{Args, Subcommand};
use graphloom::Error;
use graphloom::spec::PipelineSpec;

use super::Failure;
use super::target::{SpecArg, load};

/// The subcommands of `graphloom ontology`.
#[derive(Debug, Subcommand)]
pub enum OntologyCommand {
    /// Validate the ontology and print its type trees; exits 2 on errors.
    Check(CheckArgs),
}

/// The flags of `graphloom ontology check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    spec: SpecArg,
}

impl OntologyCommand {
    /// Checks the spec's ontology, mappings and storage options.
    pub fn run(self) -> Result<(), Failure> {
        let OntologyCommand::Check(args) = self;
        let path = args.spec.path()?;
        Ok(check(path)?)
    }
}

/// Validates the spec at `path` and prints its type trees.
fn check(path: &std::path::Path) -> Result<(), Error> {
    let (spec, ontology) = load(path)?;
    let mappings = graphloom::mapping::Mappings::compile(&spec.mapping, &ontology)?;
    check_storage_options(&spec)?;
    out!(
        "ontology of {} is valid: {} entity types, {} edge types{}{}",
        path.display(),
        ontology.entity_types.len(),
        ontology.edge_types.len(),
        if ontology.strict { " (strict)" } else { "" },
        match mappings.len() {
            0 => String::new(),
            n => format!("; {n} record mapping(s) valid"),
        }
    );
    out!("\nentity types:");
    out_raw!("{}", indent(&ontology.entity_tree.render()));
    out!("\nedge types:");
    out_raw!("{}", indent(&ontology.edge_tree.render()));
    Ok(())
}

/// Rejects storage option names the store of each location does not know
/// (the graph, the source and the response cache), as opening them would.
fn check_storage_options(spec: &PipelineSpec) -> Result<(), Error> {
    use graphloom::objstore::{check_options, parse_dir_url};
    let output = &spec.output.storage_options;
    check_options(&parse_dir_url(&spec.output.graph)?, output)?;
    if let Some(source) = &spec.source {
        let mut options = output.clone();
        options.extend(source.storage_options.clone());
        check_options(&parse_dir_url(&source.url)?, &options)?;
    }
    if let Some(cache) = &spec.llm.cache_url {
        check_options(&parse_dir_url(cache)?, output)?;
    }
    Ok(())
}

/// Each line indented by two spaces.
fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}
