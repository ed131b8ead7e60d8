//! The `orderpipe` command; all logic lives in the library.

fn main() -> std::process::ExitCode {
    orderpipe::cli::main()
}
