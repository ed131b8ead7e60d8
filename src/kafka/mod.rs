//! The Kafka ground floor: what every role needs to talk to Kafka and to
//! read or write a record's headers, with no knowledge of orders, groups'
//! handlers or the database.
//!
//! * [`client`]: the `[kafka]` settings, the base librdkafka config, the
//!   checked producer options and the measured producer.
//! * [`consumed`]: a consumed record held in one buffer ([`consumed::ConsumedRecord`]).
//! * [`record`]: header names, reading and replacing headers, a record's
//!   failure history.
//! * [`offsets`]: partition counts, a partition's offset range, and the
//!   first offset at or after a time.
//! * [`size_limit`]: the largest record a producer and a topic accept
//!   ([`size_limit::RecordLimit`]), checked before a record is produced.
//! * [`transactions`]: the open transactions the brokers coordinate
//!   (`ListTransactions`, `DescribeTransactions`), which librdkafka cannot ask.

pub mod client;
pub mod consumed;
pub mod offsets;
pub mod record;
pub mod size_limit;
pub mod transactions;
