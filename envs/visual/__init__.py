"""Image-observation environments: Sokoban, EZPoints."""
