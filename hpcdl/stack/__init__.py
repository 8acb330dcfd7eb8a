"""Software stacks: recipes, compatibility tables, detection, checks, builds and the check-build matrix."""
