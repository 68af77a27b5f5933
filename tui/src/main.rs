use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = dflash_tui::cmd::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("dflash-tui: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dflash_tui::cmd::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dflash-tui: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
