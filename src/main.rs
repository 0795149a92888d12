//! The `graphloom` binary: everything is in [`cli`], which maps the outcome
//! of a command to an exit code: 0 ok, 1 runtime error, 2 usage or
//! configuration error.

// The CLI is where output goes to the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

mod cli;

// The engine allocates many small strings and JSON values per LLM call
// (prompts, cache entries, parsed replies); glibc's allocator spent about a
// third of a cached replay's CPU time in malloc and free.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::run()
}
