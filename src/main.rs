//! The `stategate` binary: everything it does lives in `cli/` (commands) and the
//! library (the server and the engine).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
