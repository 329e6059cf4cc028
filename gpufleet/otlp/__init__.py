"""OpenTelemetry metrics (OTLP) as Prometheus metrics: names and labels in Prometheus'
conventions, counters and histograms kept cumulative, served by the standalone agent.
Pure: no sockets (the receivers are the agent's, `agent/otlp_receiver.py`)."""
