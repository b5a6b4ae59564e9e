"""Tasks served by a Ray Serve cluster (the `[ray]` extra): replicas that each wrap one Runtime,
tasks routed to the replicas that hold them (Ray Serve's model multiplexing), and an ingress
that speaks the same OpenAI API as `prefix-edge serve`. See app.py."""
