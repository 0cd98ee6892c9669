"""Multi-device partition (Wolong): a planned model split across devices with a transfer plan, and
its execution across Ray actors."""
