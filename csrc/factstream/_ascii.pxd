# Named ASCII bytes for the byte scanners (``p[0] == C_COMMA``, not ``p[0] == 44``).
# An anonymous enum: plain C integer constants, compared at no cost.

cdef enum:
    C_BS = 8          # \b
    C_TAB = 9         # \t
    C_LF = 10         # \n
    C_FF = 12         # \f
    C_CR = 13         # \r
    C_SPACE = 32
    C_QUOTE = 34      # "
    C_PLUS = 43       # +
    C_COMMA = 44      # ,
    C_MINUS = 45      # -
    C_DOT = 46        # .
    C_SLASH = 47      # /
    C_0 = 48
    C_9 = 57
    C_COLON = 58      # :
    C_UPPER_A = 65
    C_UPPER_E = 69
    C_UPPER_F = 70
    C_UPPER_I = 73    # Infinity
    C_UPPER_N = 78    # NaN
    C_LBRACKET = 91   # [
    C_BACKSLASH = 92
    C_RBRACKET = 93   # ]
    C_LOWER_A = 97
    C_LOWER_B = 98
    C_LOWER_E = 101
    C_LOWER_F = 102
    C_LOWER_N = 110
    C_LOWER_R = 114
    C_LOWER_T = 116
    C_LOWER_U = 117
    C_LBRACE = 123    # {
    C_RBRACE = 125    # }
