//! Resolution: deciding which mentions are the same node, and which facts
//! are the same or contradict each other.
//!
//! * [`entities`] finds candidates with DataFusion joins (folded names,
//!   identity properties, MinHash/LSH band keys, partial names) and turns
//!   them into clusters under the merge rules;
//! * [`mentions`] lays the run's mentions out as a table and holds the
//!   candidate pairs every way of finding them gives; [`udfs`] the
//!   functions their plans call;
//! * [`embedding`] proposes the nearest neighbours by name vector (LSH
//!   over random-hyperplane signatures) for references no name rule finds;
//! * [`linkage`] matches types with `[[resolve.linkage]]` rules by
//!   blocking keys and weighted field comparisons ([`compare`]), or by a
//!   trained model ([`probabilistic`]);
//! * [`record_types`] gives text mentions of a record's entity the
//!   record's type, so a small model's other guess does not split it;
//! * [`judge`] asks the LLM, in batches, about what the rules leave open
//!   (ambiguous entities, contradicting facts);
//! * [`facts`] folds duplicate facts and invalidates contradicted ones;
//! * [`stage`] puts them together for a run, from classified mentions and
//!   facts to node and edge rows.
//!
//! The name normalisation, shingles and MinHash/LSH band keys they share
//! live in [`crate::text`] (re-exported here).

pub mod compare;
pub mod embedding;
pub mod entities;
pub mod facts;
pub mod judge;
pub mod linkage;
pub mod mentions;
pub mod probabilistic;
pub mod record_types;
pub mod stage;
pub mod udfs;

pub use facts::{FactResolution, resolve_facts};

pub use crate::spec::resolve::{DEFAULT_CORPORATE_SUFFIXES, ResolveSpec};
pub use crate::text::*;
