//! The command line: [`USAGE`] and [`Options`].

use std::path::PathBuf;

use crate::support::number;

pub(crate) const USAGE: &str = "\
usage: rocketmq_ack_load [options]
  --duration SECS        producing time per mode in (a) and (b) (default 60)
  --rate N               messages per second (default 8000)
  --body BYTES           message body size (default 4096)
  --scenarios LIST       any of a,b,c (default a,b,c)
  --topics-b N           topics of scenario (b) (default 1000)
  --queues-a Q           queues of the topic of (a) (default 4)
  --queues-b Q           queues per topic of (b) (default 1)
  --c-messages N         acks per path in (c) (default 1000000)
  --c-in-flight N        concurrent AckMessage calls of the raw ceiling in (c) (default 4, the
                         batcher's max_in_flight_per_key)
  --c-submitters N       tasks submitting acks to the batcher in (c) (default 1)
  --c-single N           also ack N messages with one entry per call in (c) (default 50000; 0 = skip)
  --follow-deadlines SECS  also run (a)/(b) with AckSettings::follow_deadlines(SECS) and print
                         it against the default batched mode (entries per request, exposure)
  --no-immediate         skip the immediate mode of (a)/(b) and its table
  --emulator PATH        the rocketmq_emulator binary (default: next to this executable)
  --markdown-out PATH    also write the tables to PATH
";

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) duration: u64,
    pub(crate) rate: u64,
    pub(crate) body: usize,
    pub(crate) scenarios: Vec<char>,
    pub(crate) topics_b: u32,
    pub(crate) queues_a: u32,
    pub(crate) queues_b: u32,
    pub(crate) c_messages: usize,
    pub(crate) c_in_flight: usize,
    pub(crate) c_submitters: usize,
    pub(crate) c_single: usize,
    pub(crate) follow_deadlines: Option<u64>,
    pub(crate) no_immediate: bool,
    pub(crate) emulator: PathBuf,
    pub(crate) markdown_out: Option<PathBuf>,
}

pub(crate) fn parse_options(args: Vec<String>) -> Result<Options, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut options = Options {
        duration: 60,
        rate: 8_000,
        body: 4096,
        scenarios: vec!['a', 'b', 'c'],
        topics_b: 1000,
        queues_a: 4,
        queues_b: 1,
        c_messages: 1_000_000,
        c_in_flight: 4,
        c_submitters: 1,
        c_single: 50_000,
        follow_deadlines: None,
        no_immediate: false,
        emulator: exe.with_file_name("rocketmq_emulator"),
        markdown_out: None,
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--duration" => options.duration = number(&flag, args.next())?,
            "--rate" => options.rate = number(&flag, args.next())?,
            "--body" => options.body = number(&flag, args.next())?,
            "--scenarios" => {
                let list = args.next().ok_or("--scenarios needs a value")?;
                options.scenarios = list
                    .split(',')
                    .map(|s| match s.trim() {
                        "a" => Ok('a'),
                        "b" => Ok('b'),
                        "c" => Ok('c'),
                        other => Err(format!("unknown scenario {other:?} (a, b, c)")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--topics-b" => options.topics_b = number(&flag, args.next())?,
            "--queues-a" => options.queues_a = number(&flag, args.next())?,
            "--queues-b" => options.queues_b = number(&flag, args.next())?,
            "--c-messages" => options.c_messages = number(&flag, args.next())?,
            "--c-in-flight" => options.c_in_flight = number(&flag, args.next())?,
            "--c-submitters" => options.c_submitters = number(&flag, args.next())?,
            "--c-single" => options.c_single = number(&flag, args.next())?,
            "--follow-deadlines" => {
                options.follow_deadlines = Some(number(&flag, args.next())?);
            }
            "--no-immediate" => options.no_immediate = true,
            "--emulator" => options.emulator = args.next().ok_or("--emulator needs a path")?.into(),
            "--markdown-out" => {
                options.markdown_out =
                    Some(args.next().ok_or("--markdown-out needs a path")?.into());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if options.duration == 0 || options.rate == 0 || options.body == 0 {
        return Err("--duration, --rate and --body must be positive".into());
    }
    if options.c_in_flight == 0 || options.c_submitters == 0 || options.c_messages == 0 {
        return Err("--c-messages, --c-in-flight and --c-submitters must be positive".into());
    }
    Ok(options)
}
