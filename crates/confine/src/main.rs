//! `upager-confine`: see the library docs (`upager_confine`) and `--help`.
//! Exit status: 2 for a bad command line, 126 when the filter cannot be
//! installed, 127 when the command cannot be executed (as `env` does);
//! otherwise the command's own, since the launcher becomes the command.
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let plan = match upager_confine::parse_args(std::env::args_os().skip(1)) {
        Ok(Some(plan)) => plan,
        Ok(None) => {
            print!("{}", upager_confine::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("upager-confine: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(nr) = plan.number {
        println!("{nr}");
        return ExitCode::SUCCESS;
    }
    if plan.print {
        print!("{}", plan.describe());
        return ExitCode::SUCCESS;
    }
    let err = plan.run();
    eprintln!("upager-confine: {err}");
    ExitCode::from(match err {
        upager_confine::ConfineError::Install(_) => 126,
        _ => 127,
    })
}
