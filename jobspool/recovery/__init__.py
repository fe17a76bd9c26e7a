"""Boot recovery, replay of prepared jobs, fsck and retention pruning."""
