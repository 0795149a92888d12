//! graphloom's integration tests, one binary with a module per area (a
//! single binary keeps link time down).

// Tests may unwrap and print; the library's lints forbid both.
#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod add_command;
mod architecture;
mod batch_mode;
mod bench;
mod cli;
#[cfg(feature = "cluster")]
mod cluster;
mod common;
mod convergence;
mod corpus_resolution;
mod cues;
mod embedding_candidates;
mod fuzz;
mod interop;
mod llm_client;
mod llm_concurrency;
mod llm_endpoints;
mod llm_test_server;
mod local_llm;
mod object_storage;
mod ontology_rules;
mod outputs;
mod record_linkage;
mod record_mapping;
mod resolution;
mod run_pipeline;
mod slt;
mod source;
mod spec_table;
mod store_protocol;
mod suite;
mod typed_facts;
