"""RQ job entry points, queues, the schedule and worker bootstrap (thin: see vmpool/)."""
