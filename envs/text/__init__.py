"""Text-observation environments: text Sokoban, text EZPoints, TextWorld."""
