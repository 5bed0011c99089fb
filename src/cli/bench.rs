//! `oncekv bench`: closed-loop load against a running cluster through the
//! client library. Each bench client is one `Client` (one session) with
//! `--pipeline` requests in flight (1 = one request at a time, as the peer
//! etcd comparison of docs/benchmarks.md is measured). Prints throughput and latency
//! percentiles; `--compare` runs the same load through the plain
//! (at-least-once, sessionless) path too and prints the registry's cost.
//! Leader kills are timed by the harness's `failover-bench`, not here.

use oncekv_client::{Client, ClientConfig, Error};
use oncekv_core::{Command, Value};
use oncekv_testkit::percentile;
use serde::Serialize;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mix {
    /// Puts of `--value-size` bytes over 1,000 keys per client.
    Put,
    /// Increments of one counter per client.
    Incr,
    /// Appends of `--value-size` bytes over 10,000 lists per client.
    Append,
    /// 50% puts, 30% increments, 20% appends.
    Mixed,
}

#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Concurrent bench clients, each with its own session.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub clients: u64,
    /// Seconds of measured load.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: u64,
    /// Requests in flight per client (1: closed loop, one at a time).
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    #[arg(long, value_enum, default_value_t = Mix::Put)]
    pub mix: Mix,
    /// Bytes per value (puts) or element (appends).
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Use the plain, at-least-once path (no session) instead.
    #[arg(long)]
    pub plain: bool,
    /// Run the registry path, then the plain path, and print both.
    #[arg(long)]
    pub compare: bool,
}

/// The figures of one run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub clients: usize,
    pub pipeline: usize,
    pub mix: Mix,
    pub value_size: usize,
    pub seconds: f64,
    pub ops: u64,
    pub errors: u64,
    pub unknown: u64,
    pub ops_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

fn command(mix: Mix, client: usize, n: u64, value: &[u8]) -> Command {
    let kind = match mix {
        Mix::Mixed => match n % 10 {
            0..=4 => Mix::Put,
            5..=7 => Mix::Incr,
            _ => Mix::Append,
        },
        other => other,
    };
    match kind {
        Mix::Put | Mix::Mixed => Command::Put {
            key: format!("bench-p{client}-{}", n % 1_000).into_bytes(),
            value: Value::Bytes(value.to_vec()),
        },
        Mix::Incr => Command::Increment {
            key: format!("bench-c{client}").into_bytes(),
            delta: 1,
        },
        Mix::Append => Command::Append {
            key: format!("bench-l{client}-{}", n % 10_000).into_bytes(),
            element: value.to_vec(),
        },
    }
}

/// Default deadline of one bench request, retries included.
pub const TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// Runs one measured load; each request within `timeout`.
pub async fn run_once(
    args: &BenchArgs,
    endpoints: &[String],
    plain: bool,
    timeout: Duration,
    credentials: &oncekv_client::credentials::Credentials,
) -> anyhow::Result<Report> {
    let config = ClientConfig {
        call_timeout: timeout,
        credentials: credentials.clone(),
        ..ClientConfig::default()
    };
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        let client = Client::with_config(endpoints.to_vec(), config.clone());
        if !plain && let Err(error) = client.client_id().await {
            return Err(match error {
                Error::Unavailable(detail) => {
                    tracing::debug!(%detail, "could not register a bench session");
                    let probes = super::reach::probe(endpoints, timeout).await;
                    let diagnosis = super::reach::diagnose(&probes, Some(&detail));
                    anyhow::anyhow!("{}\nhint: {}", diagnosis.message, diagnosis.hint)
                }
                other => anyhow::anyhow!("cannot register a bench session: {other}"),
            });
        }
        clients.push(client);
    }
    let value = vec![b'v'; args.value_size];
    let started = Instant::now();
    let until = started + Duration::from_secs(args.duration);
    let mut loops = Vec::new();
    for (index, client) in clients.iter().enumerate() {
        for lane in 0..args.pipeline.max(1) {
            let client = client.clone();
            let value = value.clone();
            let mix = args.mix;
            let lanes = args.pipeline.max(1) as u64;
            loops.push(tokio::spawn(async move {
                let (mut latencies, mut errors, mut unknown) = (Vec::new(), 0u64, 0u64);
                let mut n = lane as u64;
                while Instant::now() < until {
                    let command = command(mix, index, n, &value);
                    n += lanes;
                    let sent = Instant::now();
                    let result = if plain {
                        client.execute_plain(command).await
                    } else {
                        client.execute(command).await
                    };
                    match result {
                        Ok(_) => latencies
                            .push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32),
                        Err(Error::OutcomeUnknown { .. } | Error::PlainOutcomeUnknown { .. }) => {
                            unknown += 1
                        }
                        Err(_) => errors += 1,
                    }
                }
                (latencies, errors, unknown)
            }));
        }
    }
    let (mut latencies, mut errors, mut unknown) = (Vec::new(), 0, 0);
    for handle in loops {
        let (lane, lane_errors, lane_unknown) = handle.await?;
        latencies.extend(lane);
        errors += lane_errors;
        unknown += lane_unknown;
    }
    let seconds = started.elapsed().as_secs_f64();
    for client in &clients {
        client.close().await;
    }
    latencies.sort_unstable();
    Ok(Report {
        mode: if plain { "plain" } else { "registry" },
        clients: args.clients as usize,
        pipeline: args.pipeline.max(1),
        mix: args.mix,
        value_size: args.value_size,
        seconds,
        ops: latencies.len() as u64,
        errors,
        unknown,
        ops_per_second: latencies.len() as f64 / seconds,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        p999_ms: percentile(&latencies, 0.999),
    })
}

fn print(report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!(
            "{:<8} clients {:>3}  pipeline {:>2}  mix {:?}  {} B  {:.1} s: {:>9.0} ops/s  p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  (ok {}, errors {}, unknown {})",
            report.mode,
            report.clients,
            report.pipeline,
            report.mix,
            report.value_size,
            report.seconds,
            report.ops_per_second,
            report.p50_ms,
            report.p99_ms,
            report.p999_ms,
            report.ops,
            report.errors,
            report.unknown
        );
    }
    Ok(())
}

impl BenchArgs {
    /// Runs the benchmark with the common flags (`--endpoints`, `--json`,
    /// `--timeout-ms` per request).
    pub async fn run(&self, common: &super::CommonArgs) -> anyhow::Result<()> {
        let endpoints = common
            .endpoints()
            .map_err(|failure| anyhow::anyhow!("{}", failure.message()))?;
        let timeout = common.timeout_or(TIMEOUT_MS_DEFAULT);
        let credentials = common.credentials()?;
        let modes: &[bool] = if self.compare {
            &[false, true]
        } else {
            std::slice::from_ref(&self.plain)
        };
        let mut reports = Vec::new();
        for &plain in modes {
            let report = run_once(self, &endpoints, plain, timeout, &credentials).await?;
            print(&report, common.json)?;
            reports.push(report);
        }
        if let [registry, plain] = reports.as_slice()
            && plain.ops_per_second > 0.0
            && !common.json
        {
            println!(
                "registry overhead: {:.1}% fewer ops/s than plain writes",
                (1.0 - registry.ops_per_second / plain.ops_per_second) * 100.0
            );
        }
        Ok(())
    }
}
