"""The job socket: training ranks' step reports, who sent them, and their processes."""
