"""shmring.model_tests: lockstep machines (model next to implementation) and their tests."""
