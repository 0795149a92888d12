//! Writing to stdout. `out!` and `out_raw!` are `println!` and `print!`
//! that end the process quietly on a closed pipe (`graphloom sql ... |
//! head`) instead of panicking.

/// Writes to stdout; a closed pipe ends the process with 0, any other
/// write error with 1.
pub fn emit(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`emit`].
macro_rules! out {
    () => { $crate::cli::output::emit("\n") };
    ($($arg:tt)*) => { $crate::cli::output::emit(&format!("{}\n", format_args!($($arg)*))) };
}

/// `print!` through [`emit`].
macro_rules! out_raw {
    ($($arg:tt)*) => { $crate::cli::output::emit(&format!($($arg)*)) };
}
